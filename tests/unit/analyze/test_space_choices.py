"""The analyzer's search space beyond instances and batching: KIND_GPU instances on the
GPUs ``--gpu`` picks (pure: the GPU count is handed in, so it runs on a host without
one), ONNX Runtime's inter-op threads, the progress it shows, and the explanation of why
the winner won (shoal/analyze/space.py, progress.py, report.py)."""

from __future__ import annotations

import io

import pytest

from shoal.analyze.progress import Progress, fraction, live_line
from shoal.analyze.report import config_pbtxt, why
from shoal.analyze.search import Goal, PointResult, Sample
from shoal.analyze.space import Point, apply, gpu_choice, space_for, start_point
from tests.unit.analyze.test_search import CONFIG


def _s(c: int, tput: float) -> Sample:
    return Sample(c, tput, 1.0, 2.0, 3.0)


def test_gpus_present_add_the_gpu_kind_to_the_space() -> None:
    assert gpu_choice(None, 2) == ((0, 1), "")  # where the host has GPUs: all of them
    assert gpu_choice("1", 2) == ((1,), "")
    assert gpu_choice("none", 2) == ((), "")
    space = space_for(CONFIG, cpus=2, gpus=(1,))
    assert space.kind == ("KIND_CPU", "KIND_GPU") and space.gpus == (1,)
    start = start_point(CONFIG)
    assert start.kind == "KIND_CPU"
    assert Point(1, 8, kind="KIND_GPU") in space.neighbours(start)
    gpu = apply(CONFIG, Point(2, 8, kind="KIND_GPU"), space.gpus)
    assert gpu["instance_group"] == [{"kind": "KIND_GPU", "count": 2, "gpus": [1]}]
    assert start_point(gpu) == Point(2, 8, kind="KIND_GPU")
    back = apply(gpu, Point(2, 8))  # and back to the CPU: no GPU list left behind
    assert back["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    # a backend that cannot use a GPU keeps to the CPU
    cpu_only = space_for({**CONFIG, "backend": "openvino"}, cpus=2, gpus=(0,))
    assert cpu_only.kind == ("KIND_CPU",) and cpu_only.gpus == ()


def test_asking_for_a_gpu_on_a_host_without_one_says_so_and_stays_on_the_cpu() -> None:
    gpus, note = gpu_choice("all", 0)
    assert gpus == () and "this host shows no GPU" in note and "KIND_CPU" in note
    assert gpu_choice(None, 0) == ((), "")  # not asked: nothing to say
    assert space_for(CONFIG, cpus=2, gpus=gpus).kind == ("KIND_CPU",)
    with pytest.raises(ValueError, match="has GPUs 0-1; got 0,3"):
        gpu_choice("0,3", 2)
    with pytest.raises(ValueError, match="device ids such as 0,1; got first"):
        gpu_choice("first", 2)


def test_onnx_runtime_inter_op_threads_run_the_parallel_execution_mode() -> None:
    space = space_for(CONFIG, cpus=4)
    assert space.inter_threads == (0, 1, 2, 4)
    assert space_for({**CONFIG, "backend": "openvino"}, cpus=4).inter_threads == (0,)
    p = Point(1, 8, inter_threads=2)
    cfg = apply(CONFIG, p)
    assert cfg["parameters"] == {
        "execution_mode": {"string_value": "1"},
        "inter_op_thread_count": {"string_value": "2"},
    }
    assert start_point(cfg) == p and "parallel 2 inter" in p.label()
    assert apply(cfg, Point(1, 8))["parameters"] == {}  # sequential again
    own = {**CONFIG, "parameters": {"execution_mode": {"string_value": "1"}}}
    assert start_point(own).inter_threads == -1  # parallel with the default pool: kept
    assert apply(own, start_point(own))["parameters"] == own["parameters"]
    config_pbtxt(cfg, "m")  # the validator accepts it


def test_progress_lines_stay_and_a_terminal_gets_a_live_bar() -> None:
    assert fraction(2, 10, 150, 300) == 0.5  # the nearer limit: time
    assert fraction(9, 10, 0, 300) == 0.9
    line = live_line(0.5, 3, 40, 150, 300, "2 inst / mbs 8", 200)
    assert line.startswith("[" + "#" * 12 + "." * 12 + "]  50%  point 3/40  150 s/300 s")
    assert len(live_line(0.5, 3, 40, 150, 300, "x" * 500, 60)) == 59
    plain = io.StringIO()
    shown = Progress(40, 300, plain)  # not a terminal: lines only
    shown.note("point 1 (0 s of 300 s): 1 inst")
    shown.point(1, 0.0, "1 inst")
    shown.close()
    assert plain.getvalue() == "[analyze] point 1 (0 s of 300 s): 1 inst\n"
    term = io.StringIO()
    live = Progress(40, 300, term, live=True)
    live._rich = None  # (ours, whether rich is installed or not)
    live.point(2, 30.0, "2 inst")
    live.note("measured")
    live.close()
    out = term.getvalue()
    assert "point 2/40  30 s/300 s  2 inst" in out and "[analyze] measured\n" in out
    assert out.endswith("\r\x1b[2K")  # the live line is cleared at the end


def test_the_report_says_why_the_winner_won() -> None:
    own = PointResult(Point(1, 8), [_s(4, 100.0)])
    winner = PointResult(Point(2, 8), [_s(4, 180.0)])
    close = PointResult(Point(2, 8, 0), [_s(4, 182.0)])
    worse = PointResult(Point(2, 4), [_s(4, 90.0)])
    failed = PointResult(Point(2, 8, threads=1), error="RuntimeError: no")
    far = PointResult(Point(4, 4), [_s(4, 500.0)])  # two knobs away: not a neighbour
    lines = why([own, winner, close, worse, failed, far], winner, Goal())
    assert lines[0] == "- Against the model's own config it changes instances: 1 -> 2."
    assert "- instances 2 -> 1: 100.0 inferences/s, -44 % against the winner." in lines
    assert any("queue delay" in x and "+1 %" in x and "within the noise" in x for x in lines)
    assert any(x.startswith("- max_batch_size 8 -> 4: 90.0") for x in lines)
    assert any("backend threads" in x and "not a candidate (RuntimeError: no)" in x for x in lines)
    assert not any("500" in x for x in lines)
