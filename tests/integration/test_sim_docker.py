"""Each simulated Spark runs a real Docker engine: the production `docker run` flags, exec, save|load."""

import json

import pytest

from sparkcluster.sim import image
from tests.support.helpers import ssh

pytestmark = [pytest.mark.sim, pytest.mark.docker]

RUN = "docker run --rm --privileged --gpus all --ipc=host --network host"


@pytest.fixture(scope="module")
def head_image(cluster):
    """The registry-free test image, imported on spark-1 only (the others must receive it by copy)."""
    tar = image.build()
    image.import_into(cluster, ["spark-1"], image.DEFAULT_TAG, tar)
    return image.DEFAULT_TAG


def test_privileged_gpu_container_runs_with_the_hosts_network(cluster, head_image):
    out = ssh(cluster, "spark-1", f"{RUN} {head_image} sh -c 'hostname; ls /sys/class/net'", user="root").stdout.split()
    assert out[0] == "spark-1"
    assert {"enP7s7", "enp1s0f1np1", "enP2p1s0f1np1"} <= set(out[1:])
    hook_log = ssh(cluster, "spark-1", "cat /var/log/nvidia-container-runtime-hook.log", user="root").stdout
    assert "prestart" in hook_log  # --gpus all went through the NVIDIA hook


def test_detached_container_inspect_and_exec(cluster, head_image):
    ssh(cluster, "spark-1", f"docker run -d --privileged --gpus all --rm --ipc=host --network host --name vllm_node "
                            f"-e VLLM_HOST_IP=10.0.0.1 {head_image} sleep 300", user="root")
    try:
        doc = json.loads(ssh(cluster, "spark-1", "docker inspect vllm_node", user="root").stdout)[0]
        host_config = doc["HostConfig"]
        assert host_config["Privileged"] and host_config["NetworkMode"] == "host" and host_config["IpcMode"] == "host"
        assert host_config["DeviceRequests"][0]["Count"] == -1
        assert host_config["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
        env = ssh(cluster, "spark-1", "docker exec vllm_node env", user="root").stdout
        assert "VLLM_HOST_IP=10.0.0.1" in env.split()
    finally:
        ssh(cluster, "spark-1", "docker rm -f vllm_node", user="root", check=False)


def test_image_copies_over_the_fabric_with_the_same_id(cluster, head_image, fresh_host):
    target = cluster.host(fresh_host).fabric_ips[0]
    assert ssh(cluster, fresh_host, f"docker image inspect {head_image}", user="root", check=False).returncode != 0
    ssh(cluster, "spark-1", f"docker save {head_image} | ssh -o BatchMode=yes root@{target} docker load", user="root")
    ids = [ssh(cluster, h, f"docker image inspect -f '{{{{.Id}}}}' {head_image}", user="root").stdout
           for h in ("spark-1", fresh_host)]
    assert ids[0] == ids[1] and ids[0].startswith("sha256:")
    # docker group membership is what lets the login user talk to the engine (bootstrap's job)
    assert "permission denied" in ssh(cluster, fresh_host, "docker ps", check=False).stderr
    ssh(cluster, fresh_host, "sudo usermod -aG docker spark")
    assert ssh(cluster, fresh_host, "docker ps -q").returncode == 0  # a new login picks the group up
