"""The per-job LoRA request rule (core/loras.py): allow-list, pinned revisions, limits, never a URL."""

import pytest

from h3batch.core.loras import LoraError, adapter_set_key, base_refusal, check_loras, mp4_tag, policy_of
from h3batch.settings import ConfigError, Settings

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
POLICY = policy_of((f"style=acme/h3-style@{COMMIT}", "local=/srv/loras/character", f"acme/h3-ink@{COMMIT}"),
                   max_loras=2)


def test_named_and_pinned_hub_refs_resolve_onto_the_record():
    """An allow-listed name and an allow-listed org/repo@commit resolve to what the worker fetches, scale kept."""
    record = check_loras([{"ref": "style", "scale": 0.5}, {"ref": f"acme/h3-ink@{COMMIT}"}], POLICY)
    assert record == [{"ref": "style", "scale": 0.5, "repo": "acme/h3-style", "revision": COMMIT},
                      {"ref": f"acme/h3-ink@{COMMIT}", "scale": 1.0, "repo": "acme/h3-ink", "revision": COMMIT}]
    assert check_loras([{"ref": "local", "scale": -1}], POLICY) == [
        {"ref": "local", "scale": -1.0, "path": "/srv/loras/character"}]
    assert check_loras(None, POLICY) == []


@pytest.mark.parametrize(
    "items, code, field",
    [
        ([{"ref": "style"}] * 3, "too_many_loras", "loras"),
        ([{"ref": "nope"}], "unknown_lora", "loras[0].ref"),
        ([{"ref": "https://example.invalid/a.safetensors"}], "unknown_lora", "loras[0].ref"),
        ([{"ref": "hf://acme/h3-style"}], "unknown_lora", "loras[0].ref"),
        ([{"ref": "acme/other@" + COMMIT}], "unknown_lora", "loras[0].ref"),
        ([{"ref": "acme/h3-style@main"}], "lora_revision_not_allowed", "loras[0].ref"),
        ([{"ref": "acme/h3-style"}], "lora_revision_not_allowed", "loras[0].ref"),
        ([{"ref": "acme/h3-style@" + OTHER}], "lora_revision_not_allowed", "loras[0].ref"),
        ([{"ref": "style", "scale": 4.5}], "lora_scale_out_of_range", "loras[0].scale"),
        ([{"ref": "style", "scale": float("nan")}], "lora_scale_out_of_range", "loras[0].scale"),
        ([{"ref": "style", "scale": True}], "lora_scale_out_of_range", "loras[0].scale"),
        ([{"ref": "style", "weight": 1}], "invalid_request", "loras[0]"),
        ([{"ref": "style"}, {"ref": "style"}], "invalid_request", "loras[1].ref"),
        ("style", "invalid_request", "loras"),
    ],
    ids=["too-many", "unknown-name", "https-url", "hf-url", "unlisted-repo", "branch", "no-revision",
         "other-revision", "scale-high", "scale-nan", "scale-bool", "extra-key", "twice", "not-a-list"],
)
def test_refusals_carry_code_and_field(items, code, field):
    """Each bad `loras` value is refused with its stable code and the field it names."""
    with pytest.raises(LoraError) as caught:
        check_loras(items, POLICY)
    assert (caught.value.code, caught.value.field) == (code, field)
    assert str(caught.value).startswith(f"{field}: ")


def test_allow_list_setting_is_checked_at_start():
    """H3BATCH_LORA_ALLOW refuses an unpinned Hub entry and an unnamed folder, naming the variable."""
    assert Settings.from_env({"H3BATCH_LORA_ALLOW": f"style=acme/s@{COMMIT}, local=/srv/x"}).lora_allow == (
        f"style=acme/s@{COMMIT}", "local=/srv/x")
    for bad in ("style=acme/s@main", "/srv/x", "https://example.invalid/x"):
        with pytest.raises(ConfigError, match="^H3BATCH_LORA_ALLOW: expected"):
            Settings.from_env({"H3BATCH_LORA_ALLOW": bad})


def test_base_refusal_keys_and_tags():
    """Only a native release takes adapters; equal sets share a key whatever their order; the MP4 tag names each
    adapter with its revision and scale."""
    assert base_refusal(["v2"]).startswith("per-job LoRAs need the native MiniMax-H3 release; the fleet serves v2")
    assert base_refusal(["v2", "native"]) is None
    a = check_loras([{"ref": "style", "scale": 0.5}, {"ref": "local"}], POLICY)
    b = check_loras([{"ref": "local"}, {"ref": "style", "scale": 0.5}], POLICY)
    assert adapter_set_key(a) == adapter_set_key(b) != adapter_set_key(a[:1]) and adapter_set_key([]) == ""
    assert mp4_tag(a) == f"acme/h3-style@{COMMIT}*0.5,/srv/loras/character*1"
