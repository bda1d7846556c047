"""Both servers' API reference at /docs works offline: the page is self-contained (no
external URL, so no CDN), points at the app's own /openapi.json, which is served, and the
CDN-based /redoc page is gone."""
from __future__ import annotations

import re

import httpx
import pytest

from features.apidocs import api_docs_html
from prediction_server.app import create_app as prediction_app
from prediction_server.settings import Settings as PredictionSettings
from support.servers import run_app
from training_server.app import create_app as training_app
from training_server.settings import Settings as TrainingSettings

EXTERNAL = re.compile(r"""(https?:)?//[a-z0-9.-]+\.[a-z]{2,}""", re.I)


def _apps(tmp_path):
    yield "training", training_app(TrainingSettings.from_env({}, data_dir=str(tmp_path / "data")))
    yield "prediction", prediction_app(PredictionSettings.from_env({}, training_server_url=""))


@pytest.mark.parametrize("which", ["training", "prediction"])
def test_docs_page_is_self_contained_and_its_spec_is_served(tmp_path, which):
    app = dict(_apps(tmp_path))[which]
    with run_app(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        page = c.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        text = page.text
        assert app.title in text and '"spec": "/openapi.json"' in text and "<script>" in text
        assert not EXTERNAL.search(text), EXTERNAL.search(text).group(0)
        assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text)
        spec = c.get("/openapi.json")
        assert spec.status_code == 200
        doc = spec.json()
        assert doc["info"]["title"] == app.title and doc["paths"]
        assert "/docs" not in doc["paths"]                # the page itself is not an API operation
        assert c.get("/redoc").status_code == 404          # the CDN-based page is not served


def test_page_follows_a_root_path_and_escapes_the_title():
    text = api_docs_html("a <b> & c", "/prefix/openapi.json", "/prefix")
    assert "a &lt;b&gt; &amp; c" in text and "<b>" not in text
    assert '{"spec": "/prefix/openapi.json", "root": "/prefix"}' in text
    assert "</script>" not in api_docs_html("t", "/x</script>.json").split('id="docs-config">')[1].split("</script>")[0]
