"""The rooms' import rules (docs/architecture.md), checked on the source's import graph, lazy imports included.

A failure names the whole chain, e.g. `h3batch.api.schemas -> h3batch.worker.h3.geometry -> torch`.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.h3batch.import_graph import chain, cycles, graph

MODEL_STACK = {"torch", "triton", "diffusers", "transformers", "safetensors", "accelerate"}


def _in(*prefixes: str):
    return lambda node: any(node == p or node.startswith(p + ".") for p in prefixes)


def _any(*tests):
    return lambda node: any(t(node) for t in tests)


CLIENT_MAY_USE_FROM_CORE = {"h3batch.core", "h3batch.core.jsonl", "h3batch.core.archive_names"}
"""The pure rules the client shares with the server: how a JSONL file is cut into lines and how archive members are
named."""

SETTINGS_MAY_USE = {"pydantic", "pydantic_core", "pydantic_settings"}
"""h3batch.settings reads the environment with pydantic-settings; nothing else outside the standard library."""

RULES = {
    # room: (what it may not reach, why)
    "h3batch.api": (_any(_in("h3batch.worker", "h3batch.kernels"), lambda n: n in MODEL_STACK),
                    "the API never imports the model stack or the model room"),
    "h3batch.core": (_any(_in("h3batch.api", "h3batch.worker", "h3batch.kernels", "h3batch.loadrunner"),
                          lambda n: n in MODEL_STACK | {"flask", "werkzeug", "gunicorn"}),
                     "the core is torch-free, Flask-free and imports no room above it"),
    "h3batch.kernels": (_in("h3batch.worker", "h3batch.api", "h3batch.core", "h3batch.loadrunner"),
                        "kernels/ never imports the service"),
    "h3batch.loadrunner": (_any(_in("h3batch.api", "h3batch.worker", "h3batch.core", "h3batch.kernels"),
                                lambda n: n in MODEL_STACK),
                           "the load runner imports nothing of the video service"),
    "h3batch.client": (_any(_in("h3batch.api", "h3batch.worker", "h3batch.kernels", "h3batch.loadrunner"),
                            lambda n: _in("h3batch.core")(n) and n not in CLIENT_MAY_USE_FROM_CORE,
                            lambda n: n in MODEL_STACK | {"flask", "werkzeug", "gunicorn", "redis", "celery"}),
                       "the client imports only httpx2, pydantic, tqdm and core's two pure helpers: it runs on a "
                       "laptop with no Redis, Flask or model stack"),
    "h3batch.settings": (lambda n: n.split(".")[0] not in sys.stdlib_module_names | SETTINGS_MAY_USE,
                         "settings is the bottom floor: the standard library and pydantic-settings only"),
}


@pytest.fixture(scope="module")
def edges():
    return graph()


@pytest.mark.parametrize("room", sorted(RULES))
def test_room_imports_only_what_it_may(edges, room):
    """No module of the room reaches a forbidden module through any chain of imports."""
    forbidden, why = RULES[room]
    offences = []
    for module in sorted(m for m in edges if m == room or m.startswith(room + ".")):
        found = chain(edges, module, forbidden)
        if found:
            offences.append(" -> ".join(found))
    assert not offences, f"{why}:\n" + "\n".join(offences)


def test_no_import_circles():
    """No two product modules import each other, directly or through others (lazy imports count)."""
    assert cycles(graph(parents=False)) == []


def test_rules_catch_a_planted_chain():
    """The checker reports the chain it finds (guards against a rule that can never fail)."""
    planted = {"h3batch.api.x": {"h3batch.core.y"}, "h3batch.core.y": {"torch"}}
    assert chain(planted, "h3batch.api.x", RULES["h3batch.api"][0]) == ["h3batch.api.x", "h3batch.core.y", "torch"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_the_api_app_loads_without_the_model_stack():
    """Building the Flask app and importing every API module leaves torch, triton, diffusers and transformers unloaded."""
    code = ("import pkgutil, sys, importlib, h3batch.api as api\n"
            "for m in pkgutil.iter_modules(api.__path__): importlib.import_module('h3batch.api.' + m.name)\n"
            "api.create_app({'TESTING': True})\n"
            "bad = sorted(n for n in ('torch', 'triton', 'diffusers', 'transformers') if n in sys.modules)\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
