"""Issue 48, platform guards: serve refuses a GB10 memory share above 0.90 and a container /dev/shm above 16g (exit 2,
before anything connects), whether the value comes from the flags after --, a recipe or its template's --set, or
--docker-arg; --force lets it through with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine import session as session_module
from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.serving import headroom

INVENTORY = "hosts:\n  s1: {address: 10.0.0.1, role: head}\n"
TEMPLATE_RECIPE = """\
recipe_version: "2"
model: org/m
runtime: vllm
defaults:
  gpu_memory_utilization: 0.8
command: |
  vllm serve org/m --gpu-memory-utilization {gpu_memory_utilization}
"""


class Connected(Exception):
    """Raised where serve would open its first connection: the guard let the command through."""


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    def connecting(*args: object, **kwargs: object) -> None:
        raise Connected()
    monkeypatch.setattr(session_module, "Transport", connecting)
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    return path


def serve(capsys: pytest.CaptureFixture[str], inventory: Path, *argv: str) -> tuple[int | None, str]:
    """(exit code, stderr); None where serve went on to connect."""
    try:
        code: int | None = cli.main(["serve", "-i", str(inventory), "--model", "org/m", *argv])
    except Connected:
        code = None
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--", "--gpu-memory-utilization", "0.95"], "--gpu-memory-utilization 0.95 is above 0.90"),
    (["--", "--gpu_memory_utilization=0.93"], "--gpu-memory-utilization 0.93 is above 0.90"),
    (["--docker-arg=--shm-size=64g"], "--shm-size=64g is above 16g"),
    (["--docker-arg=--shm-size", "--docker-arg=64gb"], "--shm-size 64gb is above 16g"),
])
def test_above_the_bound_is_refused_before_connecting(capsys, inventory, argv, said):
    code, err = serve(capsys, inventory, *argv)
    assert code == EXIT_USAGE, err
    assert said in err
    assert "hasso5703/dgx-spark-qwen38#2" in err or "DGX-Spark#31" in err  # the thread that found it
    assert "--force" in err  # the fix names the way through


def test_a_recipe_and_its_template_are_held_alike(capsys, inventory, tmp_path):
    recipe = tmp_path / "r.yml"
    recipe.write_text("flags:\n  --gpu-memory-utilization: 0.95\n")
    code, err = serve(capsys, inventory, "--recipe", str(recipe))
    assert code == EXIT_USAGE and "--gpu-memory-utilization 0.95 is above 0.90" in err, err
    template = tmp_path / "t.yml"
    template.write_text(TEMPLATE_RECIPE)
    code, err = serve(capsys, inventory, "--recipe", str(template))
    assert code is None, err  # the template's default, 0.8, is within the bound
    code, err = serve(capsys, inventory, "--recipe", str(template), "--set", "gpu_memory_utilization=0.96")
    assert code == EXIT_USAGE and "0.96 is above 0.90" in err, err
    # the flags after -- win over the recipe: the final value is the one held
    code, err = serve(capsys, inventory, "--recipe", str(recipe), "--", "--gpu-memory-utilization", "0.85")
    assert code is None, err


def test_a_sparkrun_recipes_shm_size_is_named_as_not_applied(capsys, inventory, tmp_path):
    """sparkcluster runs eugr's --ipc=host and none of sparkrun's executor_config: the size asked is not silently lost."""
    recipe = tmp_path / "r.yml"
    recipe.write_text(TEMPLATE_RECIPE + "executor_config:\n  ipc: shareable\n  shm_size: 64gb\n")
    code, err = serve(capsys, inventory, "--recipe", str(recipe))
    assert code is None, err  # nothing of it reaches docker run, so nothing to refuse
    assert (f"{recipe}:10: executor_config.shm_size 64gb is not applied: sparkcluster runs the container with "
            "--ipc=host") in err
    assert "--docker-arg=--ipc=private --docker-arg=--shm-size=10g" in err


def test_force_lets_it_through_with_a_warning(capsys, inventory):
    code, err = serve(capsys, inventory, "--force", "--docker-arg=--shm-size=64g", "--",
                      "--gpu-memory-utilization", "0.95")
    assert code is None, err
    assert "warning: --gpu-memory-utilization 0.95 is above 0.90" in err
    assert "warning: --shm-size=64g is above 16g" in err and "served anyway (--force)" in err


@pytest.mark.parametrize("argv", [[], ["--", "--gpu-memory-utilization", "0.90"], ["--docker-arg=--shm-size=10g"],
                                  ["--docker-arg=--shm-size=16g"], ["--docker-arg=--shm-size=10.24g"]])
def test_within_the_bound_goes_on_without_a_word(capsys, inventory, argv):
    code, err = serve(capsys, inventory, *argv)
    assert code is None, err
    assert "warning" not in err


def test_docker_reads_sizes_in_binary_multiples():
    assert headroom.shm_bytes("10g") == 10 * 1024**3
    assert headroom.shm_bytes("64gb") == headroom.shm_bytes("64GiB") == 64 * 1024**3
    assert headroom.shm_bytes("1024m") == 1024**3
    assert headroom.shm_bytes("2048") == 2048
    assert headroom.shm_bytes("lots") is None
    # the last --shm-size wins, as Docker reads repeated flags
    assert headroom.shm_breach(["--shm-size=64g", "--shm-size=10g"]) is None
    assert headroom.shm_breach(["--shm-size=10g", "--shm-size=17g"]) is not None


def test_hold_raises_the_first_breach():
    with pytest.raises(UsageError, match="0.99 is above 0.90"):
        headroom.hold(["--gpu-memory-utilization", "0.99"], ["--shm-size=64g"], force=False)
    assert len(headroom.hold(["--gpu-memory-utilization", "0.99"], ["--shm-size=64g"], force=True)) == 2
    assert headroom.hold(["--max-model-len", "4096"], [], force=False) == ()
