"""A real S3 endpoint on 127.0.0.1 for the checkpoint tests: moto's HTTP
server (state kept across stop()/start(), so an outage can be simulated)."""

from __future__ import annotations

import socket
from typing import Any

BUCKET = "meshrun-ckpt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's threaded server; stop()/start() keep the data (in-process state)."""

    def __init__(self, access_key: str = "x", secret_key: str = "x") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: Any = None
        self.access_key, self.secret_key = access_key, secret_key

    def start(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        # moto leaves the listening socket open (connections would hang, not
        # fail); close it so the endpoint is really down.
        self.server._server.server_close()
        self.server = None

    def client(self, url: str | None = None) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=url or self.url,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def keys(self, prefix: str, bucket: str = BUCKET) -> list[str]:
        out = self.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return sorted(o["Key"] for o in out)

    def complete_steps(self, run_name: str, bucket: str = BUCKET) -> list[int]:
        pre = f"meshrun/{run_name}/"
        return sorted(
            int(k[len(pre) :].split("/")[0][5:])
            for k in self.keys(pre, bucket)
            if k.endswith("/manifest.json")
        )


class EtagRewritingProxy:
    """A real HTTP proxy in front of an S3 endpoint that answers with ETags
    that are not the MD5 of the object, as S3 does for SSE-KMS / SSE-C
    objects and many S3-compatible stores do always. The ETags it hands out
    are the server's with the hex digits reversed (so it can map them back
    when a client quotes one, e.g. in CompleteMultipartUpload). With
    ``drop_checksums`` it also hides the additional checksums
    (``x-amz-checksum-*`` headers), like stores that keep none."""

    def __init__(self, upstream: str, drop_checksums: bool = False) -> None:
        import http.client
        import http.server
        import re
        import threading
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        etag_xml = re.compile(rb"(<ETag>(?:&quot;|\")?)([0-9a-f]{32})")
        self.requests: list[str] = []
        proxy = self

        def flip(m: re.Match[bytes]) -> bytes:
            return m.group(1) + m.group(2)[::-1]

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                body = etag_xml.sub(flip, body)  # ETags quoted back to the server
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")}
                for k in [k for k in headers if k.lower() in ("if-match", "if-none-match")]:
                    headers[k] = re.sub(r"[0-9a-f]{32}", lambda m: m.group(0)[::-1], headers[k])
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                proxy.requests.append(self.command)
                if self.command != "HEAD":
                    data = etag_xml.sub(flip, data)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    if drop_checksums and k.lower().startswith("x-amz-checksum-"):
                        continue
                    if k.lower() == "etag":
                        v = re.sub(r"[0-9a-f]{32}", lambda m: m.group(0)[::-1], v)
                    self.send_header(k, v)
                if self.command == "HEAD":
                    self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TamperingProxy:
    """A real HTTP proxy (127.0.0.1) in front of an S3 endpoint that
    corrupts what a careless client would accept: ``flip_puts`` request
    bodies of PUTs (objects and parts) get one byte flipped on the way (the
    checksum header the client sent goes on unchanged, and moto stores it
    without checking the body), and with ``wrong_checksum`` every
    ``x-amz-checksum-sha256`` the store answers with is replaced by another
    value. Bounded: it flips at most ``flip_puts`` bodies."""

    def __init__(self, upstream: str, *, flip_puts: int = 0, wrong_checksum: bool = False) -> None:
        import base64
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self.flips_left = flip_puts
        self.flipped: list[str] = []
        self.payload_signatures: list[str] = []  # x-amz-content-sha256 of each PUT
        lock = threading.Lock()
        proxy = self
        wrong = base64.b64encode(b"\0" * 32).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = bytearray(self.rfile.read(length) if length else b"")
                if self.command == "PUT":
                    proxy.payload_signatures.append(self.headers.get("x-amz-content-sha256", ""))
                if self.command == "PUT" and body:
                    with lock:
                        flip = proxy.flips_left > 0
                        proxy.flips_left -= int(flip)
                    if flip:
                        body[len(body) // 2] ^= 0xFF
                        proxy.flipped.append(self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")}
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                conn.request(self.command, self.path, body=bytes(body), headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    if wrong_checksum and k.lower() == "x-amz-checksum-sha256":
                        v = wrong + ("-" + v.split("-", 1)[1] if "-" in v else "")
                    self.send_header(k, v)
                if self.command == "HEAD":
                    self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
