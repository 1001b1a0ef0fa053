"""Sweep plots (spec §15.1.7): metric vs session count, log2 x, pass/fail marked; headless matplotlib (Agg)."""
from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (file stem, summary column, y label, reference line, reference label)
PLOTS = (
    ("send_lateness_p99", "send_lateness_p99_ms", "p99 send lateness (ms)", 80.0, "80 ms frame period"),
    ("first_audio", "first_audio_ms", "first audio after stream start (ms)", None, None),
    ("client_rtf", "client_stream_rtf", "client stream RTF", 1.0, "real time"),
    ("server_rtf", "server_stream_rtf", "server stream RTF (10-90 % slope)", 1.0, "real time"),
    ("pass_fraction", "pass_fraction", "passed sessions / requested", 1.0, None),
)


def _series(rows: list[dict], column: str) -> dict[int, list[tuple[int, float | None, bool, bool]]]:
    """load_frames -> [(sessions, value, ok, pacing warning)] with pass_fraction derived on the fly."""
    out: dict[int, list] = {}
    for row in rows:
        if column == "pass_fraction":
            requested = row.get("requested_sessions") or row.get("sessions") or 1
            value = (row.get("passed_sessions") or 0) / requested
        else:
            value = row.get(column)
        out.setdefault(row["load_frames"], []).append(
            (row["sessions"], value, row.get("ok") is True, bool(row.get("pacing_warning_sessions"))))
    return out


def render(rows: list[dict], out_dir: Path, title: str, ceilings: dict | None = None) -> list[str]:
    """Write one PNG per metric into `out_dir`; returns the file names."""
    names = []
    ceilings = ceilings or {}
    for stem, column, ylabel, ref, ref_label in PLOTS:
        fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
        for frames, points in sorted(_series(rows, column).items()):
            by_n: dict[int, list] = {}
            for n, value, ok, warn in points:
                by_n.setdefault(n, []).append((value, ok, warn))
            xs = sorted(by_n)
            medians, run_x, run_y = [], [], []
            for n in xs:
                values = [v for v, _, _ in by_n[n] if v is not None]
                all_ok = all(ok for _, ok, _ in by_n[n])
                warned = any(w for _, _, w in by_n[n])
                med = statistics.median(values) if values else None
                medians.append(med)
                if med is None:
                    continue
                if len(values) > 1:
                    ax.errorbar([n], [med], yerr=[[med - min(values)], [max(values) - med]], fmt="none",
                                ecolor="grey", capsize=3)
                ax.plot([n], [med], marker="o" if all_ok else "x", color="tab:green" if all_ok else "tab:red",
                        markersize=7, linestyle="none")
                if warned:
                    ax.plot([n], [med], marker="^", markersize=12, markerfacecolor="none", color="tab:orange",
                            linestyle="none")
                # Lines join only consecutive passing points: no interpolation across failures.
                if all_ok:
                    run_x.append(n)
                    run_y.append(med)
                else:
                    if len(run_x) > 1:
                        ax.plot(run_x, run_y, color="tab:blue", linewidth=1)
                    run_x, run_y = [], []
            if len(run_x) > 1:
                ax.plot(run_x, run_y, color="tab:blue", linewidth=1, label=f"{frames} frames")
        if ref is not None:
            ax.axhline(ref, color="black", linestyle="--", linewidth=0.8, label=ref_label)
        if column == "client_stream_rtf" and ceilings.get("max_client_rtf"):
            ax.axhline(ceilings["max_client_rtf"], color="tab:red", linestyle=":", label="ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions (log2)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}\no pass   x fail   △ pacing warning", fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{stem}.png"
        fig.savefig(out_dir / name)
        plt.close(fig)
        names.append(name)
    return names
