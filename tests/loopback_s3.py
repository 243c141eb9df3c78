"""A real S3 endpoint on 127.0.0.1 for the checkpoint tests: moto's HTTP
server (state kept across stop()/start(), so an outage can be simulated)."""

from __future__ import annotations

import re
from typing import Any

from harness import free_port

BUCKET = "meshrun-ckpt"


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


class _Proxy:
    """A real HTTP proxy (127.0.0.1) in front of an S3 endpoint; subclasses
    change what passes through by overriding the hooks."""

    def __init__(self, upstream: str) -> None:
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")}
                body = proxy.request(
                    self.command, self.path, headers, self.rfile.read(length) if length else b""
                )
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = proxy.response_body(self.command, resp.read())
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        continue
                    v = proxy.response_header(k.lower(), v)
                    if v is not None:
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

    def request(self, command: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        """The body sent upstream (``headers`` may be changed in place)."""
        return body

    def response_body(self, command: str, data: bytes) -> bytes:
        return data

    def response_header(self, name: str, value: str) -> str | None:
        """The value sent back for this (lower-case) header; None drops it."""
        return value

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class EtagRewritingProxy(_Proxy):
    """A real HTTP proxy in front of an S3 endpoint that answers with ETags
    that are not the MD5 of the object, as S3 does for SSE-KMS / SSE-C
    objects and many S3-compatible stores do always. The ETags it hands out
    are the server's with the hex digits reversed (so it can map them back
    when a client quotes one, e.g. in CompleteMultipartUpload). With
    ``drop_checksums`` it also hides the additional checksums
    (``x-amz-checksum-*`` headers), like stores that keep none."""

    _ETAG_XML = re.compile(rb"(<ETag>(?:&quot;|\")?)([0-9a-f]{32})")
    _HEX32 = re.compile(r"[0-9a-f]{32}")

    def __init__(self, upstream: str, drop_checksums: bool = False) -> None:
        self.requests: list[str] = []
        self.drop_checksums = drop_checksums
        super().__init__(upstream)

    @classmethod
    def _flip_xml(cls, data: bytes) -> bytes:
        return cls._ETAG_XML.sub(lambda m: m.group(1) + m.group(2)[::-1], data)

    @classmethod
    def _flip_hex(cls, value: str) -> str:
        return cls._HEX32.sub(lambda m: m.group(0)[::-1], value)

    def request(self, command: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        for k in [k for k in headers if k.lower() in ("if-match", "if-none-match")]:
            headers[k] = self._flip_hex(headers[k])
        return self._flip_xml(body)  # ETags quoted back to the server

    def response_body(self, command: str, data: bytes) -> bytes:
        self.requests.append(command)
        return data if command == "HEAD" else self._flip_xml(data)

    def response_header(self, name: str, value: str) -> str | None:
        if self.drop_checksums and name.startswith("x-amz-checksum-"):
            return None
        return self._flip_hex(value) if name == "etag" else value


class TamperingProxy(_Proxy):
    """A real HTTP proxy (127.0.0.1) in front of an S3 endpoint that
    corrupts what a careless client would accept: ``flip_puts`` request
    bodies of PUTs (objects and parts) get one byte flipped on the way (the
    checksum header the client sent goes on unchanged, and moto stores it
    without checking the body), and with ``wrong_checksum`` every
    ``x-amz-checksum-sha256`` the store answers with is replaced by another
    value. Bounded: it flips at most ``flip_puts`` bodies."""

    def __init__(self, upstream: str, *, flip_puts: int = 0, wrong_checksum: bool = False) -> None:
        import base64
        import threading

        self.flips_left = flip_puts
        self.flipped: list[str] = []
        self.payload_signatures: list[str] = []  # x-amz-content-sha256 of each PUT
        self.wrong_checksum = wrong_checksum
        self._wrong = base64.b64encode(b"\0" * 32).decode()
        self._lock = threading.Lock()
        super().__init__(upstream)

    def request(self, command: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        if command != "PUT":
            return body
        self.payload_signatures.append(
            next((v for k, v in headers.items() if k.lower() == "x-amz-content-sha256"), "")
        )
        with self._lock:
            flip = bool(body) and self.flips_left > 0
            self.flips_left -= int(flip)
        if not flip:
            return body
        out = bytearray(body)
        out[len(out) // 2] ^= 0xFF
        self.flipped.append(path)
        return bytes(out)

    def response_header(self, name: str, value: str) -> str | None:
        if self.wrong_checksum and name == "x-amz-checksum-sha256":
            return self._wrong + ("-" + value.split("-", 1)[1] if "-" in value else "")
        return value
