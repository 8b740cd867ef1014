"""A Hub-compatible HTTP server on 127.0.0.1 that serves repos from local files.

huggingface_hub pointed at it (``HF_ENDPOINT=http://127.0.0.1:PORT``) downloads from it exactly
as from the Hub: it answers the endpoints ``snapshot_download``/``hf download`` use, with the
Hub's headers and error codes:

  GET  /api/models/{repo}[/revision/{rev}]          model info (sha, siblings)
  GET  /api/models/{repo}/tree/{rev}[/{path}]        file listing (oid, size, lfs {oid, size})
  POST /api/models/{repo}/paths-info/{rev}           listing of given paths
  HEAD/GET /{repo}/resolve/{rev}/{path}              the file: ETag, X-Repo-Commit, Content-Length,
                                                     Accept-Ranges, HTTP Range (206)
  errors: 404 + X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound,
          403 + GatedRepo, 401 + "Invalid credentials in Authorization header" for a bad token.

and the endpoints ``create_repo`` / ``create_branch`` / ``create_commit`` (``upload_folder``,
``hf upload``) use, over the legacy LFS protocol (huggingface_hub uses it with
``HF_HUB_DISABLE_XET=1``; Xet's content store is not served here).  Every write needs a token in
``valid_tokens``; a commit's files are served by the download endpoints above at once:

  POST /api/repos/create                             {name, organization, visibility}; 409 if it exists
  POST /api/models/{repo}/branch/{branch}            a branch from main (or startingPoint); 409 if it exists
  POST /api/validate-yaml                            the model card's metadata (always valid here)
  POST /api/models/{repo}/preupload/{rev}            uploadMode lfs/regular per file, the remote oid
  POST /{repo}.git/info/lfs/objects/batch            upload + verify actions for the blobs not stored
  PUT  /lfs-upload/{sha256}                          the blob (its sha256 checked)
  POST /lfs-upload/{sha256}/verify                   stored, and the size agrees
  POST /api/models/{repo}/commit/{rev}               the ndjson commit: header, file (base64), lfsFile

Faults for tests: ``drop[path] = (after_bytes, times[, "fin"|"rst"])`` closes the connection
mid-file (a clean close, or a reset);
``stall[path] = after_bytes`` sends that much then waits until ``release()``; ``corrupt`` serves
flipped bytes (same size).  Every request is logged in ``requests``.

(olah, the self-hosted mirror on PyPI, was considered: it proxies and caches an upstream Hub
and cannot serve a folder of local files offline nor inject faults, so this small server is used.)

Run standalone:  python tests/hubserver.py ROOT_DIR [PORT]   (ROOT_DIR/org/name/<files>)
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack", ".onnx", ".model")
CHUNK = 1024 * 1024


@dataclass
class HubFile:
    path: str
    source: Optional[Path] = None  # served from disk (large files)
    data: Optional[bytes] = None  # or from memory
    size: int = 0
    sha256: str = ""
    git_sha1: str = ""
    lfs: bool = False

    @classmethod
    def make(cls, path: str, content: Union[bytes, Path]) -> "HubFile":
        sha256 = hashlib.sha256()
        if isinstance(content, Path):
            size = content.stat().st_size
            git = hashlib.sha1(b"blob %d\0" % size)
            with open(content, "rb") as fh:
                while chunk := fh.read(CHUNK * 8):
                    sha256.update(chunk)
                    git.update(chunk)
            src, data = content, None
        else:
            size = len(content)
            sha256.update(content)
            git = hashlib.sha1(b"blob %d\0" % size + content)
            src, data = None, content
        lfs = path.endswith(LFS_SUFFIXES) or size > 10 * 1024 * 1024
        return cls(path, src, data, size, sha256.hexdigest(), git.hexdigest(), lfs)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.source, "rb") as fh:  # type: ignore[arg-type]
            fh.seek(start)
            return fh.read(end - start)


@dataclass
class Repo:
    repo_id: str
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    messages: dict[str, str] = field(default_factory=dict)  # commit -> its summary (pushed commits)


class HubServer:
    """The server; use as a context manager or call start()/stop()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.repos: dict[str, Repo] = {}
        self.valid_tokens: set[str] = set()
        self.drop: dict[str, tuple] = {}
        self.stall: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.requests: list[dict] = []
        self.blobs: dict[str, bytes] = {}  # LFS uploads by sha256, until a commit names them
        self._released = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(_Handler):
            hub = server

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    # --- content -------------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, Union[bytes, Path]],
        *,
        revision: str = "main",
        gated: bool = False,
    ) -> str:
        """Add (or add a revision to) a repo; returns the commit sha of this revision."""
        entries = {p: HubFile.make(p, c) for p, c in sorted(files.items())}
        digest = hashlib.sha1(repo_id.encode() + revision.encode())
        for e in entries.values():
            digest.update(e.path.encode() + e.etag.encode())
        commit = digest.hexdigest()
        repo = self.repos.setdefault(repo_id, Repo(repo_id))
        repo.gated = repo.gated or gated
        repo.refs[revision] = commit
        repo.commits[commit] = entries
        return commit

    def commit(self, repo_id: str, revision: str, entries: dict[str, "HubFile"], summary: str = "") -> str:
        """A new commit on ``revision`` holding ``entries`` (a push); returns its sha."""
        repo = self.repos[repo_id]
        digest = hashlib.sha1(f"{repo_id}\0{revision}\0{repo.refs.get(revision)}\0{summary}".encode())
        for e in sorted(entries.values(), key=lambda e: e.path):
            digest.update(e.path.encode() + e.etag.encode())
        sha = digest.hexdigest()
        repo.commits[sha] = entries
        repo.refs[revision] = sha
        repo.messages[sha] = summary
        return sha

    def files_of(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Path -> content of a revision (what a test compares with what it pushed)."""
        repo = self.repos[repo_id]
        entries = repo.commits[repo.refs.get(revision, revision)]
        return {p: f.read(0, f.size) for p, f in entries.items()}

    @classmethod
    def from_folder(cls, root: Path, **kw) -> "HubServer":
        server = cls(**kw)
        for org in sorted(p for p in Path(root).iterdir() if p.is_dir()):
            for repo in sorted(p for p in org.iterdir() if p.is_dir()):
                files = {f.relative_to(repo).as_posix(): f for f in repo.rglob("*") if f.is_file()}
                server.add_repo(f"{org.name}/{repo.name}", files)
        return server

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def release(self) -> None:
        """Let stalled downloads go on (or die with their client)."""
        self._released.set()

    def reset_faults(self) -> None:
        self.drop.clear()
        self.stall.clear()
        self.corrupt.clear()
        self._released = threading.Event()

    def downloads_of(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and r.get("file") == path]

    # --- lookups ------------------------------------------------------------------------------
    def _resolve(self, repo_id: str, revision: str):
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, None
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        return repo, commit


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    # --- plumbing ---------------------------------------------------------------------------
    def _send(self, code: int, body: bytes = b"", headers: Optional[dict] = None, ctype: str = "application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload, code: int = 200, headers: Optional[dict] = None):
        self._send(code, json.dumps(payload).encode(), headers)

    def _error(self, code: int, error_code: Optional[str], message: str):
        headers = {"X-Error-Message": message}
        if error_code:
            headers["X-Error-Code"] = error_code
        self._json({"error": message}, code, headers)

    def _log(self, **extra):
        entry = {
            "method": self.command,
            "path": self.path,
            "range": self.headers.get("Range"),
            "auth": bool(self.headers.get("Authorization")),
            "t": time.time(),
        }
        entry.update(extra)
        with self.hub._lock:
            self.hub.requests.append(entry)

    def _auth_ok(self, repo: Repo) -> bool:
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if token is not None and token not in self.hub.valid_tokens:
            self._error(401, None, "Invalid credentials in Authorization header")
            return False
        if repo.private and token is None:  # the Hub does not admit that a private repo exists
            self._error(404, "RepoNotFound", "Repository not found")
            return False
        if repo.gated and token is None:
            self._error(403, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated.")
            return False
        return True

    def _repo_or_error(self, repo_id: str, revision: str):
        repo, commit = self.hub._resolve(repo_id, revision)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None, None
        if not self._auth_ok(repo):
            return None, None
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None, None
        return repo, commit

    # --- routes ---------------------------------------------------------------------------------
    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def do_PUT(self):
        self._route()

    def _route(self):
        url = urlsplit(self.path)
        raw = url.path
        try:
            if self.command in ("POST", "PUT") and self._write_route(raw):
                return
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", raw)
            if m:
                return self._model_info(unquote(m.group(1)), unquote(m.group(2) or "main"))
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", raw)
            if m:
                q = parse_qs(url.query)
                recursive = q.get("recursive", ["false"])[0].lower() == "true"
                return self._tree(unquote(m.group(1)), unquote(m.group(2)), unquote((m.group(3) or "/")[1:]), recursive)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", raw)
            if m and self.command == "POST":
                return self._paths_info(unquote(m.group(1)), unquote(m.group(2)))
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", raw)
            if m:
                return self._resolve_file(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
            self._log()
            self._error(404, None, "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # --- uploads ----------------------------------------------------------------------------------
    def _body(self) -> bytes:
        """The request body: Content-Length, or chunked transfer encoding."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _writer_ok(self) -> bool:
        """A write needs a valid token (the Hub's 401 otherwise)."""
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if token is None or token not in self.hub.valid_tokens:
            self._error(401, None, "Invalid credentials in Authorization header" if token else "You must be authenticated to write")
            return False
        return True

    def _write_route(self, raw: str) -> bool:
        routes = (
            (r"/api/repos/create", self._create_repo),
            (r"/api/validate-yaml", self._validate_yaml),
            (r"/api/models/([^/]+/[^/]+)/branch/([^/]+)", self._create_branch),
            (r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", self._preupload),
            (r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", self._lfs_batch),
            (r"/lfs-upload/([0-9a-f]{64})", self._lfs_put),
            (r"/lfs-upload/([0-9a-f]{64})/verify", self._lfs_verify),
            (r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", self._commit),
        )
        for pattern, handler in routes:
            m = re.fullmatch(pattern, raw)
            if m:
                body = self._body()
                self._log(api=handler.__name__.lstrip("_"))
                # the blob's PUT carries no token (on the Hub it is a pre-signed storage URL)
                if handler == self._lfs_put or self._writer_ok():
                    handler(body, *(unquote(g) for g in m.groups()))
                return True
        return False

    def _create_repo(self, body: bytes):
        doc = json.loads(body or b"{}")
        repo_id = f"{doc.get('organization')}/{doc.get('name')}" if doc.get("organization") else str(doc.get("name"))
        url = f"{self.hub.endpoint}/{repo_id}"
        if repo_id in self.hub.repos:
            self._json({"error": "You already created this model repo", "url": url}, 409)
            return
        with self.hub._lock:
            repo = self.hub.repos.setdefault(repo_id, Repo(repo_id, private=doc.get("visibility") == "private"))
            self.hub.commit(repo_id, "main", {}, "initial commit")
        self._json({"url": url, "name": repo_id, "id": repo.repo_id})

    def _validate_yaml(self, body: bytes):
        self._json({"errors": [], "warnings": []})

    def _create_branch(self, body: bytes, repo_id: str, branch: str):
        start = json.loads(body or b"{}").get("startingPoint") or "main"
        repo, commit = self._repo_or_error(repo_id, start)
        if repo is None:
            return
        if branch in repo.refs:
            self._error(409, None, f"Reference already exists: refs/heads/{branch}")
            return
        repo.refs[branch] = commit
        self._json({})

    def _preupload(self, body: bytes, repo_id: str, revision: str):
        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        present = repo.commits[commit]
        out = []
        for f in json.loads(body).get("files", []):
            lfs = f["path"].endswith(LFS_SUFFIXES) or int(f.get("size") or 0) > 10 * 1024 * 1024
            old = present.get(f["path"])
            out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                        "oid": old.etag if old is not None else None})
        self._json({"files": out, "commitOid": commit})

    def _lfs_batch(self, body: bytes, repo_id: str):
        if repo_id not in self.hub.repos:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        objects = []
        for obj in json.loads(body).get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub.blobs:
                href = f"{self.hub.endpoint}/lfs-upload/{obj['oid']}"
                entry["actions"] = {"upload": {"href": href}, "verify": {"href": href + "/verify"}}
            objects.append(entry)
        self._send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(), ctype="application/vnd.git-lfs+json")

    def _lfs_put(self, body: bytes, oid: str):
        if hashlib.sha256(body).hexdigest() != oid:
            self._error(400, None, "sha256 of the uploaded content does not match the oid")
            return
        with self.hub._lock:
            self.hub.blobs[oid] = body
        self._send(200, b"", ctype="text/plain")

    def _lfs_verify(self, body: bytes, oid: str):
        doc = json.loads(body or b"{}")
        blob = self.hub.blobs.get(oid)
        if blob is None or len(blob) != doc.get("size"):
            self._error(404, None, f"object {oid} not uploaded")
            return
        self._json({"success": True})

    def _commit(self, body: bytes, repo_id: str, revision: str):
        import base64

        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        entries = dict(repo.commits[commit])
        summary = ""
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                entries[value["path"]] = HubFile.make(value["path"], base64.b64decode(value["content"]))
            elif key == "lfsFile":
                blob = self.hub.blobs.get(value["oid"])
                if blob is None:
                    self._error(422, None, f"LFS object {value['oid']} of {value['path']} was never uploaded")
                    return
                entries[value["path"]] = HubFile.make(value["path"], blob)
            elif key == "deletedFile":
                entries.pop(value["path"], None)
            else:
                self._error(400, None, f"unsupported commit operation {key}")
                return
        with self.hub._lock:
            sha = self.hub.commit(repo_id, revision, entries, summary)
        self._json({"commitUrl": f"{self.hub.endpoint}/{repo_id}/commit/{sha}", "commitOid": sha, "success": True})

    def _model_info(self, repo_id: str, revision: str):
        self._log(api="model_info")
        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        files = repo.commits[commit]
        self._json(
            {
                "_id": commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": ["safetensors", "qwen3"],
                "library_name": "transformers",
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": p} for p in files],
            }
        )

    def _entry(self, f: HubFile) -> dict:
        e = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path}
        if f.lfs:
            e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        return e

    def _tree(self, repo_id: str, revision: str, prefix: str, recursive: bool):
        self._log(api="tree")
        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        files = repo.commits[commit]
        base = prefix.strip("/")
        out, dirs = [], set()
        for path, f in files.items():
            if base and not path.startswith(base + "/"):
                continue
            rest = path[len(base) + 1:] if base else path
            parts = rest.split("/")
            for i in range(1, len(parts)):
                d = "/".join(([base] if base else []) + parts[:i])
                if (recursive or i == 1) and d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
            if recursive or len(parts) == 1:
                out.append(self._entry(f))
        self._json(out)

    def _paths_info(self, repo_id: str, revision: str):
        self._log(api="paths-info")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        try:
            wanted = json.loads(body).get("paths", [])
        except ValueError:
            wanted = parse_qs(body).get("paths", [])
        files = repo.commits[commit]
        self._json([self._entry(files[p]) for p in wanted if p in files])

    def _resolve_file(self, repo_id: str, revision: str, path: str):
        self._log(api="resolve", file=path)
        repo, commit = self._repo_or_error(repo_id, revision)
        if repo is None:
            return
        f = self.hub.repos[repo_id].commits[commit].get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
            return
        start, end = 0, f.size
        rng = self.headers.get("Range")
        status = 200
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= max(f.size, 1):
                self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
                return
            start = int(m.group(1))
            end = min(int(m.group(2)) + 1, f.size) if m.group(2) else f.size
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{f.etag}"')
        self.send_header("X-Repo-Commit", commit)
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        self._stream(f, start, end)

    def _stream(self, f: HubFile, start: int, end: int):
        hub = self.hub
        drop_at, reset = None, False
        with hub._lock:
            if f.path in hub.drop:
                after, times, *mode = hub.drop[f.path]
                if times > 0:
                    drop_at, reset = after, mode == ["rst"]
                    hub.drop[f.path] = (after, times - 1, *mode)
        stall_at = hub.stall.get(f.path)
        if drop_at is None and stall_at is None and f.path not in hub.corrupt and f.source is not None:
            with open(f.source, "rb") as fh:  # fast path: the kernel copies file -> socket
                self.connection.sendfile(fh, offset=start, count=end - start)
            return
        pos = start
        while pos < end:
            limit = end
            if drop_at is not None and drop_at > pos:
                limit = min(limit, drop_at)
            elif drop_at is not None:
                limit = pos
            if stall_at is not None and stall_at > pos:
                limit = min(limit, stall_at)
            elif stall_at is not None:  # at the stall point: wait below (else it streamed straight past)
                limit = pos
            if limit == pos:
                if drop_at is not None and pos >= drop_at:
                    self._abort(reset)
                    return
                if stall_at is not None and pos >= stall_at:
                    self.wfile.flush()
                    hub._released.wait(timeout=120)
                    stall_at = None
                    continue
            chunk = f.read(pos, min(limit, pos + CHUNK))
            if f.path in hub.corrupt:
                chunk = bytes(b ^ 0xFF for b in chunk[:1]) + chunk[1:] if pos == start else chunk
            self.wfile.write(chunk)
            pos += len(chunk)
        self.wfile.flush()

    def _abort(self, reset: bool):
        """Drop the connection mid-body, like a network failure: a clean close (the client sees
        a short body) or a reset (RST: "connection reset by peer")."""
        try:
            self.wfile.flush()
            if reset:
                time.sleep(0.3)  # let the client read what was sent (a reset discards unread data)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True


def main(argv: Optional[list[str]] = None) -> None:  # pragma: no cover - manual use
    import sys

    args = argv if argv is not None else sys.argv[1:]
    server = HubServer.from_folder(Path(args[0]), port=int(args[1]) if len(args) > 1 else 0)
    print(f"HF_ENDPOINT={server.endpoint}", flush=True)
    server.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
