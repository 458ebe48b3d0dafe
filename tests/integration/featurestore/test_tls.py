"""A Redis over TLS (``rediss://``), with a certificate of a private CA, as deployment.md gives it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrec.config import RedisStoreConfig
from streamrec.consumers.native_runner import attach_store
from streamrec.errors import FeatureStoreError, FeatureStoreUnavailable
from streamrec.featurestore.redis_store import RedisFeatureStore
from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port

TLS = Path(__file__).with_name("tls")  # a self-signed certificate for 127.0.0.1 (README.md there)


@pytest.fixture
def tls_redis(service_binaries: tuple[str, str], tmp_path: Path) -> Iterator[int]:
    """A redis-server of this test's own, its TLS port (its plain one answers the start's PING)."""
    port = free_port()
    proc = start_redis("127.0.0.1", free_port(), tmp_path / "redis", extra_args=[
        "--tls-port", str(port), "--tls-cert-file", str(TLS / "cert.pem"),
        "--tls-key-file", str(TLS / "key.pem"), "--tls-ca-cert-file", str(TLS / "cert.pem"),
        "--tls-auth-clients", "no",
    ])
    yield port
    proc.stop()


def test_a_certificate_not_trusted_is_one_line_at_once_and_the_ca_setting_trusts_it(tls_redis: int) -> None:
    """Noted by the operating tour: a certificate the client did not trust was reported as a
    Redis that 'did not answer' and retried for the whole connect timeout, though no retry
    can mend it.
    """
    url = f"rediss://127.0.0.1:{tls_redis}/0"
    start = time.monotonic()
    with pytest.raises(FeatureStoreError) as caught:
        attach_store(RedisFeatureStore(RedisStoreConfig(url=url), length=8), True, 300, connect_timeout_s=30)
    assert time.monotonic() - start < 10  # not the 30 s of a Redis that does not answer
    said = str(caught.value)
    assert not isinstance(caught.value, FeatureStoreUnavailable), said
    assert "CERTIFICATE_VERIFY_FAILED" in said and "ssl_ca_certs" in said and "\n" not in said
    trusted = RedisStoreConfig(url=url, client={"ssl_ca_certs": str(TLS / "cert.pem")})
    store = RedisFeatureStore(trusted, length=8)
    assert attach_store(store, True, 300, connect_timeout_s=30)
