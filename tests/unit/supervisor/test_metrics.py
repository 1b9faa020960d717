"""The supervisor's /metrics: scraped over real HTTP from a runtime driven by real inputs."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from ftsup.common.metrics_http import MetricsListenError, serve_metrics, split_listen
from ftsup.supervisor.core.inputs import StepAggregate, StepReport, Tick
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.metrics import SupervisorMetrics, ThroughputConfig
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from tests.support.builders import config, hello


async def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return head.splitlines()[0], body


def sample(body: str, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    lines = [line for line in body.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"{prefix!r} not exported exactly once"
    return float(lines[0].split()[-1])


async def running_job(metrics: SupervisorMetrics) -> Runtime:
    runtime = Runtime(config(nodes=2, ranks_per_node=1), MemoryLog(), wall_clock=lambda: 100.0)
    runtime.metrics = metrics
    metrics.attach(runtime)
    for node in ("n1", "n2"):
        await runtime._handle(hello(node, stream_id=runtime.open_stream(StreamOutbox())))
    await runtime._handle(Tick())
    assert runtime.state.generation is not None
    return runtime


async def test_a_scrape_shows_nodes_training_signals_and_what_happened():
    metrics = SupervisorMetrics(ThroughputConfig(flops_per_token=6e6, peak_flops_per_rank=1e12))
    runtime = await running_job(metrics)
    for rank, node in enumerate(("n1", "n2")):
        report = StepReport(node, 1, rank, 1, 0.5, 0.4, 2.5, "d", grad_norm=1.25, tokens=1000)
        assert (await runtime._handle(report)).refusal is None
    refused = await runtime._handle(StepReport("ghost", 1, 0, 1, 0.5, 0.4, 2.5, "d"))
    assert refused.refusal
    server = await serve_metrics(metrics.registry, "127.0.0.1:0", metrics.refresh)
    try:
        status, body = await scrape(server.sockets[0].getsockname()[1])
    finally:
        server.close()
    assert status == "HTTP/1.1 200 OK"
    assert sample(body, "ftsup_nodes", 'role="active",state="alive"') == 2
    assert sample(body, "ftsup_node_series_limited") == 0
    assert body.count("ftsup_node_xids{") == 2, "every node's, within the limit"
    assert sample(body, "ftsup_is_leader") == 1
    assert sample(body, "ftsup_directives_owed") == 0, "no push in slices under way"
    assert sample(body, "ftsup_shard_liveness_admitted_seconds_count") == 0, "a leader is no link shard"
    assert sample(body, "ftsup_job_step") == 1
    assert sample(body, "ftsup_loss") == 2.5
    assert sample(body, "ftsup_grad_norm") == 1.25
    assert sample(body, "ftsup_tokens_per_second") == pytest.approx(4000.0)  # 2 ranks x 1000 / 0.5 s
    assert sample(body, "ftsup_mfu") == pytest.approx(4000.0 * 6e6 / (1e12 * 2))
    assert sample(body, "ftsup_rank_step_seconds", 'rank="1"') == 0.5
    assert sample(body, "ftsup_step_seconds_count") == 2
    assert sample(body, "ftsup_inputs_refused_total", 'kind="StepReport"') == 1
    assert sample(body, "ftsup_events_appended_total", 'kind="GenerationStarted"') == 1
    assert sample(body, "ftsup_event_append_seconds_count") >= 3
    assert sample(body, "ftsup_goodput_seconds", 'bucket="restart"') == 0.0, "all records at one wall time"
    assert math.isnan(sample(body, "ftsup_goodput_ettr")), "no wall time has passed yet"


async def test_per_rank_and_per_node_series_stop_at_the_limits_and_unknown_paths_are_404():
    metrics = SupervisorMetrics(ThroughputConfig(per_rank_limit=1, per_node_limit=1))
    runtime = await running_job(metrics)
    for rank, node in enumerate(("n1", "n2")):
        await runtime._handle(StepReport(node, 1, rank, 1, 0.5, 0.4, 2.5, "d"))
    server = await serve_metrics(metrics.registry, "127.0.0.1:0")
    port = server.sockets[0].getsockname()[1]
    try:
        _, body = await scrape(port)
        missing, _ = await scrape(port, "/secrets")
        wrong, _ = await scrape(port, "/metrics", method="POST")
    finally:
        server.close()
    assert "ftsup_rank_step_seconds{" not in body, "2 ranks exceed a limit of 1"
    assert sample(body, "ftsup_node_series_limited") == 1, "2 nodes exceed a limit of 1"
    assert body.count("ftsup_node_heartbeat_age_seconds{") == 1, "only the longest unheard of the two"
    assert "ftsup_node_xids{" not in body, "past the limit, a node with no Xids is not news"
    assert sample(body, "ftsup_node_heartbeat_age_max_seconds") >= 0
    assert math.isnan(sample(body, "ftsup_mfu")), "MFU needs FLOPs per token and a peak"
    assert missing.startswith("HTTP/1.1 404") and wrong.startswith("HTTP/1.1 405")


def test_bad_settings_are_named():
    with pytest.raises(MetricsListenError, match="not host:port"):
        split_listen("9464")
    with pytest.raises(ValueError, match="peak_flops_per_rank"):
        ThroughputConfig(peak_flops_per_rank=-1.0)


async def test_with_the_daemons_tls_files_metrics_are_https_and_need_a_client_certificate_from_the_ca(tmp_path):
    import ssl

    from ftsup.common import tls
    from ftsup.harness.certs import main as certs_main

    pki = tmp_path / "pki"
    assert certs_main(["--out", str(pki), "--supervisors", "sup-1", "--operators", "prometheus:read"]) == 0
    server_files = tls.TlsFiles(pki / "supervisor-sup-1.pem", pki / "supervisor-sup-1.key", pki / "ca.pem")
    metrics = SupervisorMetrics(ThroughputConfig())
    await running_job(metrics)
    server = await serve_metrics(metrics.registry, "127.0.0.1:0", metrics.refresh, tls_files=server_files)
    port = server.sockets[0].getsockname()[1]

    def client(with_certificate: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        if with_certificate:
            context.load_cert_chain(pki / "operator-prometheus.pem", pki / "operator-prometheus.key")
        return context

    async def https_scrape(context: ssl.SSLContext) -> str:
        """The response, or why there was none (TLS 1.3 refuses a missing client certificate
        after the client's handshake completed: at its first read, as an error or as EOF)."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            raw = (await asyncio.wait_for(reader.read(), 10)).decode()
            writer.close()
        except (ssl.SSLError, ConnectionError) as exc:
            return f"refused: {exc!r}"
        return raw

    try:
        head, _, body = (await https_scrape(client(with_certificate=True))).partition("\r\n\r\n")
        without_certificate = await https_scrape(client(with_certificate=False))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # plain HTTP to the TLS port
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        plain = (await asyncio.wait_for(reader.read(), 10)).decode(errors="replace")
        writer.close()
    finally:
        server.close()
    assert head.startswith("HTTP/1.1 200 OK")
    assert sample(body, "ftsup_nodes", 'role="active",state="alive"') == 2
    assert without_certificate == "" or without_certificate.startswith("refused"), without_certificate
    assert "200 OK" not in plain and "ftsup_" not in plain, plain


async def test_a_shards_fold_counts_its_parts_and_keeps_the_figures_its_parts_would():
    # A shard's packed fold of two nodes' aggregates: the metrics count two StepAggregates and keep
    # the fold's figures once (on_admitted_fold), which must expose what the parts one by one do.
    exposed: list[list[str]] = []
    for packed in (False, True):
        metrics = SupervisorMetrics(ThroughputConfig())
        runtime = await running_job(metrics)
        folds: list[int] = []
        metrics.on_admitted_fold = _counting(metrics.on_admitted_fold, folds)  # type: ignore[method-assign]
        parts = [StepAggregate.of_reports([StepReport(node, 1, rank, 1, 0.5 + rank, 0.4, 2.5 + rank, "d")])
                 for rank, node in enumerate(("n1", "n2"))]
        loop = asyncio.create_task(runtime.run())
        try:
            reply = await (runtime.submit_step_fold(StepAggregate.fold(parts)) if packed
                           else runtime.submit_run_from_stream(parts))
            outcomes = await asyncio.wait_for(reply, 5.0)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        assert [o.refusal for o in outcomes] == [None, None]
        assert folds == ([2] if packed else [])
        body = generate_latest(metrics.registry).decode()
        exposed.append([line for line in body.splitlines() if "_created" not in line and line.startswith(
            ("ftsup_step_seconds", "ftsup_compute_seconds", "ftsup_rank_", "ftsup_loss ", 'ftsup_inputs_total{kind="StepAggregate"}'))])
    assert exposed[0] == exposed[1]
    assert 'ftsup_inputs_total{kind="StepAggregate"} 2.0' in exposed[1]
    assert any(line.startswith('ftsup_rank_step_seconds{rank="1"} 1.5') for line in exposed[1])


def _counting(on_admitted_fold: Any, folds: list[int]) -> Any:
    def counted(fold: StepAggregate, parts: int) -> None:
        folds.append(parts)
        on_admitted_fold(fold, parts)
    return counted
