"""Bad input is a UserError: the CLI prints its message and exits 2, without a traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import shutil
from pathlib import Path

import pytest

import hwgptbench
from conftest import surrogate_settings
from hwgptbench.errors import UserError
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.space import SearchSpace
from test_api import DEVICE, SECTION, SPACE, VOCAB, synthetic_tables

# exceptions that never reach a user: each is caught where it is raised, and why
INTERNAL = {
    "BudgetExhausted": "a search's evaluation budget is spent; the runner stops the algorithm",
    "CallFailed": "a timed call failed; the measure stage records the row as failed",
    "PastDeadline": "a campaign's time bound passed; what it measured is kept for a rerun",
    "QuantizationUnsupported": "the backend lacks int8 kernels; the row is recorded as skipped",
    "Shortage": "other processes took the memory a group needs; the campaign plans smaller groups",
    "Unsupported": "a workload does not apply; the runtime row is recorded as skipped",
}


def package_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in the package, by name."""
    found = {}
    for module in pkgutil.walk_packages(hwgptbench.__path__, "hwgptbench."):
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == loaded.__name__):
                found[name] = value
    return found


def test_every_exception_is_a_user_error_or_internal() -> None:
    exceptions = package_exceptions()
    assert set(INTERNAL) <= set(exceptions), "INTERNAL names an exception that no longer exists"
    for name, cls in exceptions.items():
        if name in INTERNAL:
            assert not issubclass(cls, UserError), f"{name} is internal and a UserError"
        else:
            assert issubclass(cls, UserError), (f"{cls.__module__}.{name} is neither a UserError "
                                                "(bad input, exit 2) nor listed in INTERNAL")
    assert len(exceptions) - len(INTERNAL) >= 15  # the walk found the package's errors


def test_the_cli_turns_a_user_error_into_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from hwgptbench import cli

    assert cli.main(["validate", "--params", "no-such-params.yaml"]) == 2
    assert "error:" in capsys.readouterr().err


def test_stale_surrogates_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    """The space changed and only one fit was rerun: querying names both spaces and the fix."""
    from hwgptbench import cli

    perplexity, device_table = synthetic_tables()
    folder = tmp_path / "tiny" / "surrogates"
    surrogates.fit_perplexity(surrogate_settings(SECTION),
                              SPACE, VOCAB, perplexity, folder / "perplexity")
    widened = SearchSpace.from_dict("tiny", {**SPACE.to_dict(), "n_layer": [2, 3, 4, 5]})
    surrogates.fit_device(surrogate_settings(SECTION),
                          widened, VOCAB, device_table, folder / "devices" / DEVICE)
    code = cli.main(["query", "--results", str(tmp_path), "--metric", "perplexity",
                     "--arch", SPACE.sample(1, seed=0)[0].id])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "different search spaces" in err and "[2, 3, 4, 5]" in err and "make run" in err
    shutil.rmtree(folder / "devices")  # one space again: the same query answers
    assert cli.main(["query", "--results", str(tmp_path), "--metric", "perplexity",
                     "--arch", SPACE.sample(1, seed=0)[0].id]) == 0
