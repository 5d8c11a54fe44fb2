"""The nginx config of the scale-out route (checked by `nginx -t` itself) and the launcher's command lines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentmem.cli import main
from agentmem.cluster.launcher import Cluster
from agentmem.cluster.nginx import NginxConfig
from agentmem.errors import ConfigError

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def test_the_config_routes_by_agent_and_fails_over(tmp_path: Path) -> None:
    cfg = NginxConfig(listen="127.0.0.1:9000", upstreams=("127.0.0.1:9001", "10.0.0.2:8000"), workdir=str(tmp_path))
    text = cfg.render()
    assert "hash $http_x_agent_id consistent;" in text
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in text
    assert "server 10.0.0.2:8000 max_fails=1 fail_timeout=5s;" in text
    assert "proxy_buffering off;" in text, "SSE streams must not be buffered"
    assert NginxConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed: run scripts/install_nginx.sh")
def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    conf = NginxConfig(listen="127.0.0.1:9000", upstreams=("127.0.0.1:9001", "127.0.0.1:9002"),
                       workdir=str(tmp_path)).write()
    run = subprocess.run([NGINX, "-t", "-c", str(conf), "-p", str(tmp_path), "-e", str(tmp_path / "error.log")],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("bad", [dict(upstreams=()), dict(upstreams=("nohost",)), dict(listen="x:99999"),
                                 dict(max_fails=0)])
def test_bad_config_names_the_field(bad: dict[str, object], tmp_path: Path) -> None:
    kw: dict[str, object] = {"upstreams": ("127.0.0.1:9001",), "workdir": str(tmp_path), **bad}
    with pytest.raises(ConfigError):
        NginxConfig(**kw)  # type: ignore[arg-type]


def test_the_launcher_gives_each_replica_its_port_and_name(tmp_path: Path) -> None:
    c = Cluster(replicas=3, archive_url="postgresql://db/agentmem", port=7000, workdir=tmp_path,
                serve_args=["--threads", "1"])
    assert c.replica_ports == [7001, 7002, 7003]
    cmd = c.serve_command(2)
    assert cmd[cmd.index("--replica-id") + 1] == "r2" and cmd[cmd.index("--port") + 1] == "7003"
    assert cmd[-2:] == ["--threads", "1"]
    assert c.nginx_config().upstreams == ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")
    with pytest.raises(ConfigError, match="replicas"):
        Cluster(replicas=0, archive_url="postgresql://db/x")
    with pytest.raises(ConfigError, match="archive_url"):
        Cluster(replicas=1, archive_url="")


def test_cluster_nginx_config_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "nginx-config", "--upstream", "10.0.0.1:8000", "--upstream", "10.0.0.2:8000",
                 "--listen", "0.0.0.0:80", "--workdir", "/tmp/x"]) == 0
    out = capsys.readouterr().out
    assert "listen 0.0.0.0:80;" in out and out.count("max_fails=") == 2
    assert main(["cluster", "nginx-config", "--upstream", "bad"]) == 2


def test_the_package_surface_is_pinned() -> None:
    import agentmem.cluster as cluster

    assert cluster.__all__ == ["CLUSTER_DURABILITY", "ClusterPool", "LeaseKeeper", "LeaseStore", "LocalLeaseStore",
                               "Replica", "default_replica_id", "open_replica"]
    assert all(hasattr(cluster, name) for name in cluster.__all__)
