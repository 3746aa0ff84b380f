"""ptspeed.entrypoint: how the commands end on an error, and where they use it."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT, TOOLS, WORKFLOW_SCRIPTS

from ptspeed.entrypoint import EXIT_BAD_INPUT, OneLineParser, one_line_errors
from ptspeed.errors import ConfigError, ContainerError, EnvBuildError, WriteFailed


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("trials: must be at least 1"),
        EnvBuildError("uv: no such file"),
        ContainerError("podman build: exit 125"),
        FileNotFoundError(2, "No such file or directory"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_project_error_is_one_line_and_exit_status_2(
    error: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended, one_line_errors():
        raise error
    assert ended.value.code == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.err == f"error: {error}\n" and captured.out == ""
    assert ended.value.__cause__ is None and ended.value.__suppress_context__


def test_what_the_error_concerns_comes_first_and_the_status_is_the_caller_s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        pytest.raises(SystemExit) as ended,
        one_line_errors(WriteFailed, about="no record written", status=1),
    ):
        raise WriteFailed("out.json: No space left on device")
    assert ended.value.code == 1
    assert (
        capsys.readouterr().err == "error: no record written: out.json: No space left on device\n"
    )


def test_an_error_not_named_goes_on_up() -> None:
    with pytest.raises(ValueError, match="a bug"), one_line_errors(EnvBuildError):
        raise ValueError("a bug")


def test_an_unexpected_exception_is_not_swallowed() -> None:
    with pytest.raises(RuntimeError, match="a bug"), one_line_errors():
        raise RuntimeError("a bug")


def test_unexpected_names_any_other_exception_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended, one_line_errors(unexpected=True):
        raise ZeroDivisionError("division by zero")
    assert ended.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: unexpected ZeroDivisionError: division by zero\n"


def test_an_interrupt_is_never_turned_into_an_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(KeyboardInterrupt), one_line_errors(unexpected=True):
        raise KeyboardInterrupt
    assert capsys.readouterr().err == ""


def test_a_block_without_an_error_ends_normally(capsys: pytest.CaptureFixture[str]) -> None:
    with one_line_errors():
        print("done")
    assert capsys.readouterr().out == "done\n"


def test_a_usage_error_is_one_line_and_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineParser(prog="tool")
    parser.add_argument("--count", type=int, required=True)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["--count", "many"])
    assert ended.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: argument --count: invalid int value: 'many'\n"


def test_no_script_writes_its_own_error_wrapper_or_import_path() -> None:
    """One wrapper, one parser class and one bootstrap: no script copies them."""
    copies = re.compile(r"sys\.path\.insert|class \w*Parser\(argparse|except Exception as")
    scripts = [*WORKFLOW_SCRIPTS.glob("*.py"), *TOOLS.glob("*.py"), ROOT / "src/ptspeed/cli.py"]
    found = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for path in scripts
        if path.name != "_checkout.py"
        for match in copies.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
