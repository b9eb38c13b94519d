"""Autotuner on CPU: the persistent cache (concurrent writers, corruption, version change), the
choice logic (a cache hit does no timing; failing candidates; disabled tuning) and the candidates."""
import json
import multiprocessing as mp

import pytest
import torch

from equikernels import tune
from equikernels.codegen.planner import candidates
from equikernels.codegen.tp import LaunchConfig
from equikernels.tune.cache import TuneCache


@pytest.fixture(autouse=True)
def _tune_file(tmp_path, monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(tmp_path / "tuning.json"))
    monkeypatch.setenv("EQUIKERNELS_AUTOTUNE", "1")
    monkeypatch.setenv("EQUIKERNELS_TUNE_ROUNDS", "1")  # one timing per candidate (rounds: tests below)
    yield


def _writer(path, i):
    c = TuneCache(path)
    for j in range(5):
        c.put(f"k{i}_{j}", {"config": {"rows": i}, "ms": float(j)})


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.json"
    # fork: the writers only touch files, and spawned ones spent seconds each importing torch
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {f"k{i}_{j}" for i in range(4) for j in range(5)}


def test_corrupt_or_foreign_file_is_ignored_then_replaced(tmp_path):
    path = tmp_path / "t.json"
    for text in ("{not json", json.dumps({"format": 999, "entries": {"a": {"config": {}}}}), "[]"):
        path.write_text(text)
        c = TuneCache(path)
        assert c.get("a") is None
        c.put("b", {"config": {"rows": 2}, "ms": 1.0})
        assert TuneCache(path).get("b")["config"] == {"rows": 2}


def test_cache_hit_does_no_timing():
    calls = []
    first = tune.choose("key1", [{"r": 1}, {"r": 2}], lambda c: calls.append(c) or float(c["r"]), {"r": 2})
    assert first == {"r": 1} and len(calls) == 2
    tune._CACHE = None  # a new process: the choice comes from the file

    def boom(c):
        raise AssertionError("timed on a cache hit")
    assert tune.choose("key1", [{"r": 1}, {"r": 2}], boom, {"r": 2}) == {"r": 1}
    entry = tune.cache().get("key1")
    assert entry["ms"] == 1.0 and entry["default_ms"] == 2.0


def test_version_change_misses():
    tune.choose(f"{tune.device_key(torch.device('cpu'))}|x", [{"r": 1}], lambda c: 1.0, {"r": 1})
    other = tune.device_key(torch.device("cpu")).replace("equikernels", "equikernels-old")
    assert tune.cache().get(f"{other}|x") is None


def test_failing_candidates_are_skipped_and_all_failing_gives_default():
    def measure(c):
        if c["r"] == 1:
            raise RuntimeError("out of resources")
        return 3.0
    with pytest.warns(UserWarning, match="out of resources"):
        assert tune.choose("k2", [{"r": 1}, {"r": 4}], measure, {"r": 4}) == {"r": 4}

    def always(c):
        raise RuntimeError("no")
    with pytest.warns(UserWarning):
        assert tune.choose("k3", [{"r": 1}], always, {"r": 8}) == {"r": 8}
    assert tune.cache().get("k3") is None


def test_disabled_uses_default_without_timing(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_AUTOTUNE", "0")

    def boom(c):
        raise AssertionError("timed while disabled")
    assert tune.choose("k4", [{"r": 1}], boom, {"r": 4}) == {"r": 4}


def test_candidates_are_pruned():
    for default, dtype in ((LaunchConfig(4, 4), torch.float32), (LaunchConfig(8, 4), torch.float32),
                           (LaunchConfig(2, 2), torch.float64), (LaunchConfig(1, 4), torch.float32)):
        cands = candidates(default, dtype)
        assert default.rows in [c.rows for c in cands]
        assert all(1 <= c.rows <= (8 if dtype == torch.float32 else 4) for c in cands)
        assert all(c.num_warps <= max(c.rows, 4) for c in cands)
        assert len({c.rows for c in cands}) == len(cands) <= 3


def test_parallel_compile_pass_then_sequential_timing(monkeypatch):
    """Candidates other than the default run once each in worker threads (their compiles overlap),
    then every candidate is timed in the calling thread; one failing in the parallel pass is skipped."""
    import threading
    monkeypatch.setenv("EQUIKERNELS_TUNE_THREADS", "4")
    main = threading.get_ident()
    seen = []

    def measure(c):
        seen.append((c["r"], threading.get_ident() == main))
        if c["r"] == 3:
            raise RuntimeError("out of resources")
        return {1: 5.0, 2: 1.0, 4: 2.0}[c["r"]]
    with pytest.warns(UserWarning, match="out of resources"):
        best = tune.choose("kp", [{"r": 1}, {"r": 2}, {"r": 3}, {"r": 4}], measure, {"r": 1})
    assert best == {"r": 2}
    assert seen[0] == (1, True)  # the default alone, first
    assert sorted(r for r, m in seen if not m) == [2, 3, 4]  # the parallel pass
    assert sorted(r for r, m in seen[1:] if m) == [2, 4]  # timed after it; r=3 not retried
    entry = tune.cache().get("kp")
    assert [t["ms"] for t in entry["tried"]] == [5.0, 1.0, None, 2.0]
    assert "out of resources" in entry["tried"][2]["error"]


def test_no_parallel_pass_on_cpu_or_interpreter(monkeypatch):
    monkeypatch.delenv("EQUIKERNELS_TUNE_THREADS", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []
    tune.choose("kq", [{"r": 1}, {"r": 2}, {"r": 4}], lambda c: calls.append(c["r"]) or float(c["r"]), {"r": 4})
    assert calls == [4, 1, 2]  # each candidate once, default first


def test_margin_keeps_default_on_a_tie(monkeypatch):
    ms = {1: 0.99, 4: 1.0}
    assert tune.choose("km1", [{"r": 1}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 4}
    ms = {1: 0.9, 4: 1.0}
    assert tune.choose("km2", [{"r": 1}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 1}
    monkeypatch.setenv("EQUIKERNELS_TUNE_MARGIN", "0")
    monkeypatch.setenv("EQUIKERNELS_TUNE_MIN_GAIN_MS", "0")
    ms = {1: 0.99, 4: 1.0}
    assert tune.choose("km3", [{"r": 1}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 1}


def test_min_gain_keeps_default_for_short_calls(monkeypatch):
    """A relative win of 14 % but only 15 us (host jitter scale) keeps the default; 0.2 ms does not."""
    ms = {8: 0.092, 4: 0.107}
    assert tune.choose("kg1", [{"r": 8}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 4}
    ms = {8: 0.8, 4: 1.0}
    assert tune.choose("kg2", [{"r": 8}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 8}
    monkeypatch.setenv("EQUIKERNELS_TUNE_MIN_GAIN_MS", "0")
    ms = {8: 0.092, 4: 0.107}
    assert tune.choose("kg3", [{"r": 8}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4}) == {"r": 8}
    monkeypatch.setenv("EQUIKERNELS_TUNE_MIN_GAIN_MS", "fast")
    with pytest.raises(ValueError, match="EQUIKERNELS_TUNE_MIN_GAIN_MS"):
        tune.choose("kg4", [{"r": 8}, {"r": 4}], lambda c: ms[c["r"]], {"r": 4})


def test_max_candidates_and_lazy_candidates(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_TUNE_MAX_CANDIDATES", "2")
    calls = []
    tune.choose("kc", lambda: [{"r": 1}, {"r": 2}, {"r": 8}], lambda c: calls.append(c["r"]) or 1.0, {"r": 8})
    assert calls == [8, 1]  # the default plus one other

    def never():
        raise AssertionError("candidates built on a cache hit")
    assert tune.choose("kc", never, lambda c: 0.0, {"r": 8}) == {"r": 8}


def test_cache_follows_the_tune_file_variable(tmp_path, monkeypatch):
    tune.choose("kf", [{"r": 1}], lambda c: 1.0, {"r": 1})
    first = tune.cache()
    assert tune.cache() is first  # not rebuilt per call
    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(tmp_path / "other.json"))
    assert tune.cache() is not first and tune.cache().get("kf") is None
    assert tune.device_key(torch.device("cpu")) is tune.device_key(torch.device("cpu"))


def test_bucket():
    assert [tune.bucket(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("EQUIKERNELS_AUTOTUNE")
    assert not tune.enabled()


def test_cpu_ops_never_tune(monkeypatch):
    """Off the GPU the heuristic default is used and nothing is written."""
    from equikernels.catalog import problem
    from equikernels.ops import tensor_product
    p = problem("nequip-water")
    x, y = torch.randn(3, p.dim_in1), torch.randn(3, p.dim_in2)
    tensor_product(p, x, y, torch.randn(3, p.weight_numel), backend="triton")
    assert not tune.cache().path.exists()


def test_tune_command_without_gpu_says_why(capsys):
    from equikernels.cli import main
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert main(["tune", "--problems", "nequip-water"]) == 2  # the default device, cuda
    assert "--device cuda: no CUDA device is visible here, and tuning times real GPU launches" in capsys.readouterr().err
    assert main(["tune", "--problems", "nequip-water", "--device", "cpu"]) == 2
    assert "--device cpu: tuning needs a CUDA device" in capsys.readouterr().err


def test_tune_help_says_when_tuning_happens(capsys):
    from equikernels.cli import main
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Tuning is off by default" in text and "EQUIKERNELS_AUTOTUNE=1" in text


@pytest.mark.gpu
def test_tuned_forward_matches_default_and_is_cached(monkeypatch):
    """On a GPU: tuning a forward picks a candidate, remembers it, and the results are unchanged."""
    from equikernels.catalog import problem
    from equikernels.ops import tensor_product
    p = problem("nequip-water")
    x, y = torch.randn(5000, p.dim_in1, device="cuda"), torch.randn(5000, p.dim_in2, device="cuda")
    w = torch.randn(5000, p.weight_numel, device="cuda")
    monkeypatch.setenv("EQUIKERNELS_AUTOTUNE", "0")
    ref = tensor_product(p, x, y, w, layout="ir_mul")
    monkeypatch.setenv("EQUIKERNELS_AUTOTUNE", "1")
    out = tensor_product(p, x, y, w, layout="ir_mul")
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert any("|tp|" in k for k in tune.cache()._read())


def test_rounds_are_interleaved_and_a_winner_must_win_every_round(monkeypatch):
    """Three rounds: the first pass (default first) is a warm-up, then rounds in rotated order; a
    candidate faster on the median but slower than the default in one round keeps the default."""
    monkeypatch.setenv("EQUIKERNELS_TUNE_ROUNDS", "3")
    order, script = [], {1: [9.0, 0.5, 1.5], 2: [1.0, 1.0, 1.0]}  # r=1: faster median, loses round 3

    def measure(c):
        order.append(c["r"])
        return script[c["r"]][sum(1 for r in order if r == c["r"]) - 1]
    assert tune.choose("kr1", [{"r": 1}, {"r": 2}], measure, {"r": 2}) == {"r": 2}
    assert order == [2, 1, 1, 2, 2, 1]  # default first, then rotated rounds
    entry = tune.cache().get("kr1")
    assert entry["rounds"] == {"0": [1.0, 1.0, 1.0], "1": [9.0, 0.5, 1.5]}
    script[3] = [9.0, 0.5, 0.6]  # slow first pass (compile/warm-up), faster in every timed round
    order.clear()
    assert tune.choose("kr2", [{"r": 3}, {"r": 2}], measure, {"r": 2}) == {"r": 3}


def test_bad_rounds_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_TUNE_ROUNDS", "zero")
    with pytest.raises(ValueError, match="EQUIKERNELS_TUNE_ROUNDS"):
        tune.choose("kr3", [{"r": 1}, {"r": 2}], lambda c: 1.0, {"r": 2})


def test_cached_config_outside_the_candidates_is_retuned():
    """A cached configuration that is not a candidate (edited or foreign file) is not used."""
    key = "key-bogus"
    tune.cache().put(key, {"config": {"rows": -5, "bogus": "x"}, "ms": 0.1})
    tune._CACHE = None
    calls = []
    with pytest.warns(RuntimeWarning, match="not one of the candidates"):
        got = tune.choose(key, lambda: [{"rows": 1}, {"rows": 2}], lambda c: calls.append(c) or float(c["rows"]),
                          {"rows": 2})
    assert got == {"rows": 1} and calls
    tune._CACHE = None
    assert tune.cache().get(key)["config"] == {"rows": 1}  # the bad entry was replaced


@pytest.mark.parametrize("argv, needles", [
    ([], ["give --problems and/or --model"]),
    (["--problems", "nequip-watr"], ["--problems", "nequip-watr"]),
    (["--problems", "nequip-water", "--rows", "0"], ["--rows", "positive"]),
    (["--model", "no-such.model"], ["no-such.model"]),
    (["--model", "MODEL", "--atoms", "-4"], ["--atoms", "positive"]),
    (["--model", "MODEL", "--structure", "no-such.xyz"], ["--structure", "no-such.xyz"]),
    (["--problems", "nequip-water", "--structure", "STRUCTURE"], ["--structure", "only with --model"]),
    (["--problems", "nequip-water", "--device", "gpu0"], ["--device", "gpu0"]),
])
def test_tune_arguments_are_named_before_the_missing_gpu(argv, needles, capsys, tmp_path, monkeypatch):
    """Preparing a GPU run on a machine without one, a mistyped argument is named, not the missing GPU."""
    from equikernels.cli import main
    from equikernels.default_model import default_model_path
    from cli_checks import one_line_error
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cu.xyz").write_text("1\n\nCu 0 0 0\n")
    subst = {"MODEL": default_model_path(), "STRUCTURE": "cu.xyz"}
    assert main(["tune", *[subst.get(a, a) for a in argv]]) == 2
    one_line_error(capsys, *needles)


def test_tune_reads_model_and_structure_then_names_the_missing_gpu(capsys, tmp_path, monkeypatch):
    from equikernels.cli import main
    from equikernels.default_model import default_model_path
    from cli_checks import one_line_error
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bad = tmp_path / "bad.xyz"
    bad.write_text("not a structure\n")
    assert main(["tune", "--model", default_model_path(), "--structure", str(bad)]) == 2
    one_line_error(capsys, "--structure", "cannot read")
    assert main(["tune", "--model", default_model_path()]) == 2
    one_line_error(capsys, "--device cuda", "no CUDA device is visible here")
