"""A tritonserver command line starts shoal: flags shoal has no use for are taken and
named in a warning, the ones it cannot honour are refused, and --log-file, the gRPC
channel flags and gRPC TLS (one-way and mutual) work, with tritonclient."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from tests.serverctl import processes_with, served
from tools import modelgen


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flags-repo")
    modelgen.write_shipped_repository(path, ("simple",))
    return path


def _simple(client: object, module: object, **kw: object) -> np.ndarray:
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return client.infer("simple", inputs, **kw).as_numpy("OUTPUT0")  # type: ignore[attr-defined]


def test_flags_without_effect_are_named_and_the_server_serves(repo: Path) -> None:
    flags = [
        "--http-thread-count=8", "--grpc-infer-thread-count=4", "--model-load-thread-count=2",
        "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0", "--backend-directory=/opt/tritonserver/backends",
        "--trace-config=rate=100", "--response-cache-byte-size=1048576", "--rate-limit=OFF",
        "--rate-limit-resource=R:1", "--grpc-keepalive-time=10000",
        "--grpc-keepalive-permit-without-calls=true", "--grpc-http2-max-pings-without-data=0",
        "--grpc-max-response-pool-size=1",
    ]  # fmt: skip
    with served(repo, *flags) as srv:
        log = srv.log()
        assert "--http-thread-count=8 has no effect: shoal's frontends are event loops" in log
        assert "--cuda-memory-pool-byte-size=0:0,1:0 has no effect" in log
        assert "--trace-config=rate=100 has no effect" not in log  # it has: tracing's rate
        (broker,) = srv.pids("broker")
        assert b"--trace-config=rate=100" in Path(f"/proc/{broker}/cmdline").read_bytes()
        assert "--grpc-max-response-pool-size=1 has no effect" in log  # (L0_decoupled's)
        assert "--grpc-keepalive-time=10000 has no effect" not in log  # it has: a gRPC option
        assert "--rate-limit-resource has no effect: --rate-limit is off" in log
        assert "--response-cache-byte-size is deprecated (as in Triton)" in log
        (frontend,) = srv.pids("frontend")
        argv = Path(f"/proc/{frontend}/cmdline").read_bytes().split(b"\0")
        assert b"--grpc-keepalive-time=10000" in argv
        assert b"--grpc-keepalive-permit-without-calls=true" in argv
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        np.testing.assert_array_equal(_simple(client, grpcclient), np.full((1, 16), 2))


@pytest.mark.parametrize(
    ("flags", "override"),
    [
        (["--strict-model-config=true"], False),
        (["--disable-auto-complete-config", "--strict-model-config=false"], True),
    ],
)
def test_strict_model_config_is_deprecated_in_tritons_words(
    repo: Path, flags: list[str], override: bool
) -> None:
    """(Triton's L0_model_config cli_messages greps the server's output for these.)"""
    with served(repo, *flags) as srv:
        log = srv.log()
    assert (
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead." in log
    )
    overriding = (
        "Warning: Overriding deprecated '--strict-model-config' from False to True in favor "
        "of '--disable-auto-complete-config'!"
    )
    assert (overriding in log) == override


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--model-repository=/nonexistent"], "model repository '/nonexistent' is not a directory"),
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert"),
        (["--grpc-keepalive-time=-1"], "--grpc-keepalive-time must not be negative"),
        (["--log-file=/nonexistent/dir/x.log"], "cannot write the log file"),
        (["--instance-memory-limit-mb=-1"], "expected a whole number of MiB (0: none), got '-1'"),
        (["--rate-limit=on"], "invalid argument for --rate-limit"),
        (["--cache-config=redis,host=cache"], "shoal has the local cache only, not 'redis'"),
        (
            ["--rate-limit-resource=R1"],
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
            "'<resource_name>:<count>'. Got R1",
        ),
        # (L0_lifecycle greps for these: taken without effect, but checked as Triton's)
        (["--model-load-gpu-limit", "-1:0.6"], "expects device ID >= 0, got -1"),
        (
            ["--model-load-gpu-limit", "0:-0.4"],
            "expects limit fraction to be in range [0.0, 1.0], got -0.400000",
        ),
        (["--model-load-gpu-limit=0.6"], "requires format <first>:<second>. Found: 0.6"),
        (["--grpc-max-response-pool-size=0"], "--grpc-max-response-pool-size must be greater"),
        (["--trace-config=rate=fast"], 'Bad option: "--trace-config rate".'),
    ],
)
def test_flags_shoal_cannot_honour_are_refused(repo: Path, flags: list[str], words: str) -> None:
    argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_log_file_takes_every_process_lines(repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    with served(repo, f"--log-file={path}") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        _simple(client, httpclient)
        settings = client.get_log_settings()
        assert settings["log_file"] == str(path)
        with pytest.raises(InferenceServerException, match="log file location can not be"):
            client.update_log_settings({"log_file": str(tmp_path / "other.log")})
    text = path.read_text()
    for role in ("shoal[", "broker[", "frontend#0[", "worker:simple/1#0["):  # "stopped"...
        assert role in text, text
    assert "broker[" not in srv.log() and "frontend#0[" not in srv.log()  # not on stderr


def _pki(where: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def cert(
        subject: str,
        k: ec.EllipticCurvePrivateKey,
        issuer: x509.Name,
        signer: ec.EllipticCurvePrivateKey,
        ca: bool,
        san: x509.GeneralName | None = None,
    ) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            b = b.add_extension(x509.SubjectAlternativeName([san]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal test CA")])
    ca = cert("shoal test CA", ca_key, ca_name, ca_key, True)
    server_key, client_key = key(), key()
    san = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    server = cert("127.0.0.1", server_key, ca_name, ca_key, False, san)
    client = cert("client", client_key, ca_name, ca_key, False)
    files = {}
    for name, obj in (("ca", ca), ("server", server), ("client", client)):
        files[name] = where / f"{name}.pem"
        files[name].write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    for name, k in (("server_key", server_key), ("client_key", client_key)):
        files[name] = where / f"{name}.pem"
        files[name].write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return files


def test_tls_material_that_does_not_fit_is_refused_at_start(repo: Path, tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    base = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}"]
    for flags, words in [
        (
            ["--grpc-use-ssl=true", f"--grpc-server-cert={pki['server']}",
             f"--grpc-server-key={pki['client_key']}"],
            "--grpc-server-cert and --grpc-server-key are not a certificate and its key",
        ),
        (
            ["--grpc-use-ssl-mutual=true", f"--grpc-server-cert={pki['server']}",
             f"--grpc-server-key={pki['server_key']}", f"--grpc-root-cert={pki['server_key']}"],
            "--grpc-root-cert holds no certificate",
        ),
    ]:  # fmt: skip
        argv = [*base, *flags]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr


def test_keepalive_pings_the_flags_allow_keep_the_connection(repo: Path) -> None:
    """A client pinging every second without calls: allowed by these flags (grpcio's
    defaults would answer GOAWAY "too_many_pings" within seconds and drop it)."""
    flags = [
        "--grpc-keepalive-permit-without-calls=true",
        "--grpc-http2-min-recv-ping-interval-without-data=500",
    ]
    with served(repo, *flags) as srv:
        options = [
            ("grpc.keepalive_time_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}", options=options) as channel:
            states: list[grpc.ChannelConnectivity] = []
            channel.subscribe(states.append, try_to_connect=True)
            grpc.channel_ready_future(channel).result(timeout=10)
            time.sleep(5)  # five pings without a call
            assert states[-1] == grpc.ChannelConnectivity.READY, states
            assert (
                grpc.ChannelConnectivity.IDLE
                not in states[states.index(grpc.ChannelConnectivity.READY) :]
            )


def test_grpc_tls_one_way_and_mutual(repo: Path, tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    tls = [f"--grpc-server-cert={pki['server']}", f"--grpc-server-key={pki['server_key']}"]
    with served(repo, "--grpc-use-ssl=true", *tls) as srv:
        url = f"127.0.0.1:{srv.grpc_port}"
        secure = grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki["ca"]))
        np.testing.assert_array_equal(_simple(secure, grpcclient), np.full((1, 16), 2))
        plain = grpcclient.InferenceServerClient(url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
    with served(repo, "--grpc-use-ssl-mutual=true", *tls, f"--grpc-root-cert={pki['ca']}") as srv:
        url = f"127.0.0.1:{srv.grpc_port}"
        anonymous = grpcclient.InferenceServerClient(
            url, ssl=True, root_certificates=str(pki["ca"])
        )
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=5)  # no client certificate
        known = grpcclient.InferenceServerClient(
            url,
            ssl=True,
            root_certificates=str(pki["ca"]),
            private_key=str(pki["client_key"]),
            certificate_chain=str(pki["client"]),
        )
        assert known.is_server_live()
        np.testing.assert_array_equal(_simple(known, grpcclient), np.full((1, 16), 2))
    assert not processes_with(str(tmp_path))
