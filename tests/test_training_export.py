"""``python -m training_server.export URL OUT_DIR``: the served bundle of a running training
server (real, on loopback) written as a seed directory that verifies; a clear error otherwise."""
from __future__ import annotations

from features.bundle import read_bundle
from load.demo_bundle import build_bundle
from support.servers import run_app
from training_server import export
from training_server.app import create_app
from training_server.settings import Settings


def _app(data_dir, **kw):
    return create_app(Settings.from_env({}, data_dir=str(data_dir), retraining_interval_sec=60, **kw),
                      run_worker=False)


def test_the_served_bundle_is_written_as_a_verified_seed_directory(tmp_path, capsys):
    seed = build_bundle(tmp_path / "seed", 4, rounds=10)
    app = _app(tmp_path / "data", seed_bundle=str(seed))
    with run_app(app) as url:
        served = app.state.service.registry.served
        assert export.main([url, str(tmp_path / "out")]) == 0
    written = capsys.readouterr().out.strip()
    assert written == str(tmp_path / "out" / served.version)
    manifest, files = read_bundle(tmp_path / "out" / served.version)
    assert manifest["version"] == served.version and manifest["models"]
    assert set(files) == {m["file"] for m in manifest["models"].values()}


def test_a_server_serving_only_the_prior_or_no_server_is_an_error_on_stderr(tmp_path, capsys):
    with run_app(_app(tmp_path / "data")) as url:
        assert export.main([url, str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("export failed: ")
    assert not (tmp_path / "out").exists()
