"""OUTPUT/loss.png from OUTPUT/train_log.jsonl: a resumed run's repeated steps count once (the last record wins), a
line cut by a kill is skipped, eval loss is drawn where the log has it, and a DPO run's reward margin beside the
loss."""

from __future__ import annotations

import json

import pytest

from zero_kit.train.callbacks import LOSS_PNG, loss_points, write_loss_plot
from zero_kit.train.stopping import LOG_FILE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _log(tmp_path, rows: list[dict], tail: str = "") -> None:
    text = "".join(json.dumps(row) + "\n" for row in rows) + tail
    (tmp_path / LOG_FILE).write_text(text, encoding="utf-8")


def test_points_by_step_last_record_wins_and_a_cut_line_is_skipped(tmp_path):
    rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "loss": 2.4},  # resumed at step 1
            {"step": 2, "eval_loss": 2.9}, {"step": 3, "loss": 2.0}]  # fmt: skip
    _log(tmp_path, rows, tail='{"step": 4, "lo')
    assert loss_points(tmp_path / LOG_FILE) == {"train": [(1, 3.0), (2, 2.4), (3, 2.0)], "eval": [(2, 2.9)],
                                                "margin": []}  # fmt: skip


def test_the_plot_is_a_png_in_the_output_directory(tmp_path):
    _log(tmp_path, [{"step": s, "loss": 3.0 / s} for s in range(1, 6)])
    path = write_loss_plot(tmp_path)
    assert path == tmp_path / LOSS_PNG and path.read_bytes().startswith(PNG_SIGNATURE)
    assert not list(tmp_path.glob(".*partial"))


def test_no_loss_yet_no_picture(tmp_path):
    assert write_loss_plot(tmp_path) is None
    _log(tmp_path, [{"step": 1, "lr": 0.1}])
    assert write_loss_plot(tmp_path) is None and not (tmp_path / LOSS_PNG).exists()


def test_a_dpo_run_draws_its_reward_margin_on_a_second_axis(tmp_path, monkeypatch):
    import matplotlib.figure

    rows = [{"step": s, "loss": 0.69 - 0.05 * s, "reward_margin": 0.1 * s, "reward_accuracy": 0.5} for s in (1, 2, 3)]
    _log(tmp_path, rows)
    assert loss_points(tmp_path / LOG_FILE)["margin"] == [(s, pytest.approx(0.1 * s)) for s in (1, 2, 3)]
    drawn = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig) or save(fig, *a, **k)
    )
    path = write_loss_plot(tmp_path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    (fig,) = drawn
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert labels == ["train loss", "reward margin"] and fig.axes[1].get_ylabel() == "reward margin"
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["train loss", "reward margin"]
