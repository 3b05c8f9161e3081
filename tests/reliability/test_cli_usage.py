"""Usage mistakes are the user's, not crashes: every command the CLI lists, table-driven (issue 31).

Each command found in the typer app (nothing hard-coded) runs in this process with no arguments,
with an unknown option and with paths that do not exist: exit 2, the command's usage line (for
the usage mistakes) or the path named (for the missing paths), never "internal error". An
artifacts folder under a regular file exits 2 naming the file; a real bug still exits 4. One
real subprocess checks the console entry point the same way.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
import yaml
from reliability_cli import ROOT

from toolchain.cli import app, main


def run_cli(*args: str) -> SimpleNamespace:
    """``hydra-toolchain ARGS`` through the entry point in this process."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _commands() -> dict[str, typing.Any]:
    """The commands ``hydra-toolchain --help`` lists (hidden ones are not listed), by name."""
    group = typer.main.get_command(app)
    found = {name: group.get_command(None, name) for name in group.list_commands(None)}
    return {name: cmd for name, cmd in found.items() if not cmd.hidden}


COMMANDS = _commands()


def _takes_path(annotation: typing.Any) -> bool:
    return annotation is Path or any(_takes_path(a) for a in typing.get_args(annotation))


def _missing_path_args(cmd: typing.Any, where: Path) -> list[str]:
    """A call of ``cmd`` whose every required parameter is a path that does not exist (empty: none takes a path)."""
    hints = typing.get_type_hints(cmd.callback)
    args: list[str] = []
    options: list[str] = []
    for param in cmd.params:
        if not param.required:
            continue
        if not _takes_path(hints.get(param.name)):
            return []
        value = str(where / "missing" / f"{param.name}.yaml")
        if param.param_type_name == "argument":
            args.append(value)
        else:
            options += [param.opts[0], value]
    return [*options, *args] if args else []


def _usage_mistake(out: SimpleNamespace, usage: str, *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"Usage: {usage} " in out.stderr, out.stderr[-2000:]
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[-2000:])


def test_the_table_covers_the_commands_of_the_help():
    listed = run_cli("--help")
    assert listed.returncode == 0
    assert len(COMMANDS) >= 15
    for name in COMMANDS:
        assert f" {name} " in listed.stdout, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_arguments_is_a_usage_mistake(name):
    out = run_cli(name)
    _usage_mistake(out, f"hydra-toolchain {name}", "error: Missing ", f"Try 'hydra-toolchain {name} --help'")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_unknown_option_is_a_usage_mistake(name, tmp_path):
    out = run_cli(name, "--no-such-option", str(tmp_path / "x.yaml"))
    _usage_mistake(out, f"hydra-toolchain {name}", "error: No such option: --no-such-option")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_of_every_command_exits_0(name):
    out = run_cli(name, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"hydra-toolchain {name}" in out.stdout


@pytest.mark.parametrize("suffix", [".yaml", ".onnx"])
@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if _missing_path_args(c, Path("/x"))])
def test_a_path_that_does_not_exist_is_an_error_not_a_crash(name, suffix, tmp_path):
    args = [a.replace(".yaml", suffix) for a in _missing_path_args(COMMANDS[name], tmp_path)]
    out = run_cli(name, *args)
    assert out.returncode == 2, (args, out.returncode, out.stderr[-2000:])
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("error: "), out.stderr[-2000:]
    if suffix == ".yaml":  # a recipe, or the file of a command that takes no recipe: its path is named
        named = [Path(a).name for a in args if a.startswith(str(tmp_path))]
        assert any(n in out.stderr for n in named), (named, out.stderr[-2000:])
    assert not (tmp_path / "missing").exists()  # nothing created on the way


@pytest.mark.parametrize(("args", "needle"), [
    (["frobnicate"], "error: No such command 'frobnicate'"),
    (["--no-such-option", "run"], "error: No such option: --no-such-option"),
    (["export", "--opset", "seventeen", "x"], "error: Invalid value for '--opset'"),
])
def test_group_level_mistakes(args, needle):
    _usage_mistake(run_cli(*args), "hydra-toolchain", needle)


def test_no_command_shows_the_help_and_exits_2():
    out = run_cli()
    assert out.returncode == 2 and "internal error" not in out.stderr
    assert "Usage: hydra-toolchain" in out.stdout + out.stderr


def test_artifacts_folder_under_a_regular_file_is_named(tmp_path):
    (tmp_path / "plainfile").write_text("not a folder\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "x", "artifacts_dir": "plainfile/artifacts", "model": {"source": "packaged:all-MiniLM-L6-v2"},
        "data": {"id": "tweets", "ood": None, "splits": {"train": 64, "test": 32, "calib": 16, "val": 16}}}))
    out = run_cli("load", str(recipe))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "internal error" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot use ") and f"'{tmp_path / 'plainfile'}'" in last, last
    assert "is a file, not a folder" in last and "(ENOTDIR)" in last, last


def test_an_output_under_a_regular_file_is_named(tmp_path):
    import numpy as np

    graph = tmp_path / "g.onnx"
    _tiny_graph(graph)
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4), np.float32))
    (tmp_path / "plainfile").write_text("not a folder\n")
    out = run_cli("infer", str(graph), "--inputs", str(tmp_path / "in.npz"), "--out",
                  str(tmp_path / "plainfile" / "o.npz"))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "internal error" not in out.stderr and str(tmp_path / "plainfile") in out.stderr, out.stderr[-2000:]


def _tiny_graph(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))


def test_a_real_bug_still_exits_4(tmp_path, monkeypatch):
    import toolchain.artifacts

    def broken(_folder):
        raise RuntimeError("boom in verify_tree")

    monkeypatch.setattr(toolchain.artifacts, "verify_tree", broken)
    out = run_cli("verify", str(tmp_path))
    assert out.returncode == 4
    assert "internal error: RuntimeError: boom in verify_tree" in out.stderr and "Rerun with --debug" in out.stderr


def test_a_missing_file_the_toolchain_manages_is_a_bug_not_the_users(tmp_path, monkeypatch):
    """ENOENT counts as the user's only on a path the user gave (or a folder above it), not below it."""
    import toolchain.artifacts

    inside = tmp_path / "stage" / "manifest.json"

    def missing(_folder):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(inside))

    monkeypatch.setattr(toolchain.artifacts, "verify_tree", missing)
    out = run_cli("verify", str(tmp_path))
    assert out.returncode == 4 and "internal error: FileNotFoundError" in out.stderr, out.stderr[-2000:]


def test_entry_point_in_a_real_process():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "toolchain", "run"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    _usage_mistake(SimpleNamespace(returncode=out.returncode, stderr=out.stderr), "hydra-toolchain run",
                   "error: Missing argument")
