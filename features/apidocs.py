"""An API reference page that works offline, for both servers.

FastAPI's default ``/docs`` and ``/redoc`` pages load their scripts and styles from a
CDN, so they are blank on a machine (or a cluster) without internet access. This page is
self-contained: a little inline CSS and JavaScript of our own that fetch the app's
``/openapi.json`` and render every operation with its parameters, request body and
responses (``$ref`` schemas resolved), plus a "try it" form that sends the request to
the same server. It references no external URL.

Use: ``FastAPI(..., docs_url=None, redoc_url=None)`` and then ``install_api_docs(app)``.
"""
from __future__ import annotations

import html
import json

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:1em 2em;color:#1d232b}
h1{margin-bottom:.1em} .ver{color:#667} details{border:1px solid #d5dae0;border-radius:6px;margin:.5em 0}
summary{cursor:pointer;padding:.45em .7em;font-family:ui-monospace,monospace}
.m{display:inline-block;min-width:4.2em;font-weight:700;text-transform:uppercase}
.get{color:#0a6bbd}.post{color:#13884a}.put{color:#a86a00}.delete{color:#b3261e}
.op{padding:0 1em 1em} pre{background:#f5f7f9;padding:.6em;overflow:auto;font-size:13px;max-height:28em}
textarea{width:100%;min-height:8em;font-family:ui-monospace,monospace} input{font-family:ui-monospace,monospace}
.sum{color:#445;font-family:system-ui,sans-serif} h4{margin:.8em 0 .3em}
"""

_SCRIPT = r"""
const CFG = JSON.parse(document.getElementById('docs-config').textContent);
const SPEC_URL = CFG.spec;
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
};
let spec = null;
function resolve(node, seen) {
  if (Array.isArray(node)) return node.map(n => resolve(n, seen));
  if (!node || typeof node !== 'object') return node;
  if (typeof node.$ref === 'string' && node.$ref.startsWith('#/')) {
    if (seen.has(node.$ref)) return {'$ref': node.$ref};
    let t = spec;
    for (const p of node.$ref.slice(2).split('/')) t = t ? t[p] : undefined;
    return resolve(t, new Set([...seen, node.$ref]));
  }
  const out = {};
  for (const [k, v] of Object.entries(node)) out[k] = resolve(v, seen);
  return out;
}
const pretty = v => JSON.stringify(resolve(v, new Set()), null, 2);
function example(schema) {
  const s = resolve(schema || {}, new Set());
  if (s.example !== undefined) return s.example;
  if (s.examples && s.examples.length) return s.examples[0];
  if (s.default !== undefined) return s.default;
  if (s.type === 'object' || s.properties) {
    const o = {};
    for (const [k, v] of Object.entries(s.properties || {}))
      if ((s.required || []).includes(k)) o[k] = example(v);
    return o;
  }
  if (s.type === 'array') return [example(s.items)];
  return {integer: 0, number: 0, boolean: false, string: ''}[s.type] ?? null;
}
function tryIt(path, method, op) {
  const box = el('div', {});
  const params = (op.parameters || []).map(p => {
    const i = el('input', {placeholder: p.name + ' (' + p.in + ')'});
    box.append(i, ' ');
    return [p, i];
  });
  const body = op.requestBody ? (op.requestBody.content || {})['application/json'] : null;
  let ta = null;
  if (body) {
    ta = el('textarea', {});
    ta.value = JSON.stringify(example(body.schema), null, 2);
    box.append(ta);
  }
  const out = el('pre', {});
  const send = el('button', {}, 'Send');
  send.onclick = async () => {
    let url = CFG.root + path;
    const q = new URLSearchParams();
    for (const [p, i] of params) {
      if (p.in === 'path') url = url.replace('{' + p.name + '}', encodeURIComponent(i.value));
      else if (p.in === 'query' && i.value !== '') q.append(p.name, i.value);
    }
    if ([...q].length) url += '?' + q;
    const init = {method: method.toUpperCase(), headers: {}};
    if (ta) { init.body = ta.value; init.headers['Content-Type'] = 'application/json'; }
    try {
      const r = await fetch(url, init);
      const text = await r.text();
      let shown = text;
      try { shown = JSON.stringify(JSON.parse(text), null, 2); } catch (e) {}
      out.textContent = r.status + ' ' + r.statusText + '\n' + shown;
    } catch (e) { out.textContent = String(e); }
  };
  box.append(el('br', {}), send, out);
  return box;
}
function render() {
  const root = document.getElementById('ops');
  document.getElementById('title').textContent = spec.info.title;
  document.getElementById('ver').textContent = 'version ' + spec.info.version + ' - OpenAPI ' + spec.openapi;
  if (spec.info.description) document.getElementById('desc').textContent = spec.info.description;
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(item)) {
      const d = el('details', {});
      d.append(el('summary', {}, el('span', {class: 'm ' + method}, method), ' ' + path + ' ',
                  el('span', {class: 'sum'}, op.summary || '')));
      const body = el('div', {class: 'op'});
      if (op.description) body.append(el('p', {}, op.description));
      if (op.parameters && op.parameters.length)
        body.append(el('h4', {}, 'Parameters'), el('pre', {}, pretty(op.parameters)));
      if (op.requestBody) body.append(el('h4', {}, 'Request body'), el('pre', {}, pretty(op.requestBody)));
      body.append(el('h4', {}, 'Responses'), el('pre', {}, pretty(op.responses || {})));
      body.append(el('h4', {}, 'Try it'), tryIt(path, method, op));
      d.append(body);
      root.append(d);
    }
  }
}
fetch(SPEC_URL).then(r => r.json()).then(s => { spec = s; render(); })
  .catch(e => { document.getElementById('ops').textContent = 'cannot load ' + SPEC_URL + ': ' + e; });
"""


def api_docs_html(title: str, openapi_url: str, root_path: str = "") -> str:
    """The self-contained page: inline style and script, the spec fetched from ``openapi_url``
    (operations are sent to ``root_path`` + their path)."""
    cfg = json.dumps({"spec": openapi_url, "root": root_path}).replace("</", "<\\/")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)} - API</title><style>{_STYLE}</style></head><body>"
            f"<h1 id=\"title\">{html.escape(title)}</h1><div class=\"ver\" id=\"ver\"></div>"
            f"<p id=\"desc\"></p><p>Machine-readable: <a href=\"{html.escape(openapi_url)}\">"
            f"{html.escape(openapi_url)}</a></p><div id=\"ops\">loading...</div>"
            f"<script type=\"application/json\" id=\"docs-config\">{cfg}</script>"
            f"<script>{_SCRIPT}</script></body></html>")


def install_api_docs(app: FastAPI, path: str = "/docs") -> None:
    """Serve the offline page at ``path`` (the app must be built with ``docs_url=None``)."""
    openapi_url = app.openapi_url or "/openapi.json"

    async def api_docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return HTMLResponse(api_docs_html(app.title, root + openapi_url, root))

    app.add_api_route(path, api_docs, methods=["GET"], include_in_schema=False)
