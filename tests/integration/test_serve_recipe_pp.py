"""A sparkrun-format recipe from a registry, served unmodified across THREE simulated Sparks with the real CPU
vLLM as pipeline parallel TP 1 x PP 3 (as eugr's 3-node recipes run): the registry is a local git repository made
here, added without trust (its recipe's mod is refused before anything connects), then served with --trust by
`@registry/name`, answering completions with one pipeline stage per node. The three nodes are cabled as a ring
(`sim up 3 --topology ring`), as three Sparks without a switch are. One cluster, ~3 min."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sparkcluster.serving.readiness import http
from sparkcluster.sim import SimCluster, UpOptions, tinymodel
from tests.helpers import require_sim, run_cli, ssh, unique_name
from tests.integration.test_serve_host_vllm import PLUGIN_SWITCH, VLLM_ENV, host_bootstrap, processes

pytestmark = [pytest.mark.sim, pytest.mark.slow]

RECIPE = """\
recipe_version: "2"
model: local/tiny-llama
runtime: vllm
min_nodes: 3
max_nodes: 3
mods: [stage-marker]
metadata: {description: the tiny Llama in three pipeline stages}
defaults:
  tensor_parallel: 1
  pipeline_parallel: 3
  max_model_len: 256
  # Not --enforce-eager: vLLM's CPU worker then skips its warm-up run, which is where a later pipeline stage
  # allocates the buffer for the activations it receives. torch.compile with the eager backend warms up
  # without inductor's g++ builds.
  compilation_config: '{"mode": 1, "backend": "eager"}'
  served_model_name: tiny-pp
env:
  SPARKCLUSTER_PP_RECIPE: "3"
"""
MARKER_MOD = '#!/bin/sh\necho "stage ready" > "$WORKSPACE_DIR/pp-mod-ran"\n'


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory) -> Iterator[SimCluster]:
    require_sim(docker=False)
    if not (VLLM_ENV / "bin" / "vllm").exists():
        pytest.fail(f"{VLLM_ENV} is missing: run scripts/setup-vllm.sh")
    # Cabled as a 3-ring (crosswise, each cable its own subnets): ranks placed along the ring, the control plane on
    # the management LAN every node reaches, the model staged node to node over the cables.
    c = SimCluster.up(UpOptions(count=3, name=unique_name("pp"), docker=False, vllm_env=str(VLLM_ENV),
                                topology="ring"))
    try:
        host_bootstrap(c, tmp_path_factory.mktemp("cfg"))
        doc = yaml.safe_load(c.inventory_path.read_text())
        doc["vars"]["serve_env"][PLUGIN_SWITCH] = "1"  # the test plugin's eager helper: no g++ at the first request
        c.inventory_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        tinymodel.generate_on(c, "spark-1", str(VLLM_ENV / "bin" / "python"))
        yield c
    finally:
        c.down()


def registry(root: Path) -> Path:
    repo = root / "registry"
    (repo / ".sparkrun").mkdir(parents=True)
    (repo / ".sparkrun" / "registry.yaml").write_text("registries:\n  - {name: lab, recipes: recipes, mods: mods}\n")
    (repo / "recipes" / "tiny").mkdir(parents=True)
    (repo / "recipes" / "tiny" / "tiny-pp3.yaml").write_text(RECIPE)
    (repo / "mods" / "stage-marker").mkdir(parents=True)
    (repo / "mods" / "stage-marker" / "run.sh").write_text(MARKER_MOD)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(root), "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "recipes"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)
    return repo


def node_logs(c: SimCluster) -> str:
    """Every rank's own log (the head's alone seldom says why a pipeline stage stalled)."""
    return "".join(f"\n== {h} ==\n" + ssh(c, h, "tail -n 25 ~/.cache/sparkcluster/serve/main.log", check=False).stdout
                   for h in ("spark-1", "spark-2", "spark-3"))


CANARY = '#!/bin/sh\ntouch "$HOME/pwned-by-mod"\n'
HOSTS = ("spark-1", "spark-2", "spark-3")
V2 = "recipe_version: '2'\nmodel: /nowhere/tiny\n"  # a path: nothing to stage, so a mod would run at once


def git_repo(root: Path, files: dict[str, str], links: dict[str, Path] | None = None) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel, target in (links or {}).items():
        (root / rel).symlink_to(target)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(root), "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "files"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)
    return root


def test_no_route_into_an_untrusted_registry_runs_its_mod_on_a_node(cluster3, tmp_path):
    """Round 4's trust reproductions end to end: a trusted registry `good`, an untrusted `evil` whose mod touches a
    canary in each node's home, sparkrun's eugr clone trusted in sparkrun's config. Every route by which evil's mod
    ran without --trust (and good's mod that links a control-machine secret) is refused with exit 2, and no node
    holds the canary or the secret; the same mod served with --trust does run, so the canary would have shown.
    ~30 s on the module's cluster (here, on two busy cores: 29 s, most of it the control's serve)."""
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    secret = tmp_path / "control-secret.txt"
    secret.write_text("the control machine's secret")
    secret.chmod(0o600)
    good = git_repo(tmp_path / "good", {"recipes/looted.yaml": V2 + "mods: [loot-mod]\n",
                                        "mods/loot-mod/run.sh": "#!/bin/sh\ntrue\n"}, {"mods/loot-mod/loot": secret})
    evil = git_repo(tmp_path / "evil", {
        "mods/pwn/run.sh": CANARY, "recipes/direct.yaml": V2 + "mods: [pwn]\n", "recipes/base.yaml": V2 + "mods: [pwn]\n",
        "recipes/viaat.yaml": V2 + "mods: ['@good/../../evil/mods/pwn']\n",
        "recipes/viainclude.yaml": "recipe_version: '2'\ninclude: '@good/../../evil/recipes/base'\nmodel: /nowhere/x\n",
        "recipes/viaeugr.yaml": V2 + "mods: ['fix-a/../../../../../sparkcluster/registries/evil/mods/pwn']\n"})
    eugr = tmp_path / "cache" / "sparkrun" / "registries" / "eugr"
    (eugr / "mods" / "fix-a").mkdir(parents=True)
    (eugr / "mods" / "fix-a" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "config" / "sparkrun").mkdir(parents=True)
    (tmp_path / "config" / "sparkrun" / "registries.yaml").write_text("registries:\n  - {name: eugr, trusted: true}\n")
    for name, repo, trust in (("good", good, ["--trust"]), ("evil", evil, [])):
        added = run_cli("recipes", "add-registry", name, str(repo), *trust, env=user)
        assert added.returncode == 0, added.stderr

    def serve(recipe: str, *more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(cluster3.inventory_path), "--tp", "3", "--runtime", "host", "--launcher",
                       "native", "--no-verify", "--recipe", recipe, *more, env=user)

    def on_nodes(path: str) -> list[str]:
        return [h for h in HOSTS if ssh(cluster3, h, f"test -e {path}", check=False).returncode == 0]

    clone = tmp_path / "cache" / "sparkcluster" / "registries" / "evil" / "recipes" / "direct.yaml"
    for recipe in ("@evil/viaat", "@evil/viainclude", "@good/../../evil/recipes/direct", "@evil/viaeugr",
                   str(clone), "@good/looted"):
        refused = serve(recipe)
        err = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "registry '" in err, (recipe, err)
        assert on_nodes("~/pwned-by-mod") == [] and on_nodes("~/.cache/sparkcluster/mods/loot-mod") == [], recipe
    # the control: the same mod, served as the user chose to (--trust), does reach every node (the mods run before
    # vLLM starts; vLLM, given no model, is not waited for)
    try:
        ran = serve("@evil/direct", "--trust", "--ready-timeout", "5")
        assert on_nodes("~/pwned-by-mod") == list(HOSTS), ran.stderr[-2000:]
    finally:
        for host in HOSTS:
            ssh(cluster3, host, "rm -f ~/pwned-by-mod", check=False)
        run_cli("down", "-i", str(cluster3.inventory_path), env=user)


def test_a_registry_recipe_serves_tp1_x_pp3_across_three_nodes(cluster3, tmp_path):
    head = cluster3.topology.hosts[0]
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def sc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return run_cli(args[0], *(["-i", str(cluster3.inventory_path)] if args[0] == "serve" else []), *args[1:],
                       env=user, timeout=timeout)

    added = sc("recipes", "add-registry", "lab", str(registry(tmp_path)))
    assert added.returncode == 0 and "not trusted" in added.stdout, added.stderr
    listed = sc("recipes", "list", "--registry", "lab")
    assert listed.stdout.split() == ["@lab/tiny/tiny-pp3", "(lab)"], listed.stdout
    # Untrusted and bringing a mod: refused before anything connects, naming the registry and how to trust it.
    refused = sc("serve", "--runtime", "host", "--recipe", "@lab/tiny-pp3")
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "registry 'lab', which is not trusted" in err and "--trust" in err, err
    result = sc("serve", "--runtime", "host", "--recipe", "@lab/tiny-pp3", "--trust", "--ready-timeout", "400",
                "--json")
    try:
        assert result.returncode == 0, result.stderr[-2000:] + node_logs(cluster3)
        doc = json.loads(result.stdout)
        assert doc["launcher"] == "native" and doc["served_name"] == "tiny-pp"  # sparkrun's runtime: vllm
        code, text = http(f"http://{head.mgmt_ip}:8000/v1/completions",
                          {"model": "tiny-pp", "prompt": "Three stages of", "max_tokens": 8, "temperature": 0},
                          timeout=60)
        assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 8, text
        code, text = http(f"http://{head.mgmt_ip}:8000/v1/models", None, timeout=30)
        assert json.loads(text)["data"][0]["max_model_len"] == 256, text
        for rank, host in enumerate(("spark-1", "spark-2", "spark-3")):
            full = cluster3.exec_in(host, ["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
            lines = [p for p in full.splitlines() if "vllm serve" in p]
            assert lines and "--pipeline-parallel-size 3" in lines[0] and f"--node-rank {rank}" in lines[0], lines
            assert "--tensor-parallel-size 1" in lines[0]
            assert ssh(cluster3, host, "cat ~/pp-mod-ran").stdout.strip() == "stage ready"
    finally:
        down = run_cli("down", "-i", str(cluster3.inventory_path), "--json", env=user)
    assert down.returncode == 0, down.stderr
    for host in ("spark-1", "spark-2", "spark-3"):
        assert "vllm serve" not in processes(cluster3, host)
