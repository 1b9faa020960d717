"""The trainer library imports no framework it does not need: `import ftsup.trainer` (and the
integrations package itself) must not pull in transformers, accelerate or lightning."""

import subprocess
import sys

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning", "lightning_fabric")
LIBRARY = ("ftsup.trainer", "ftsup.trainer.session", "ftsup.trainer.snapshot", "ftsup.trainer.integrations",
           "ftsup.trainer.integrations.state")


def loaded(imports: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    """The top-level packages of `watched` that a fresh interpreter holds after `imports`."""
    probe = f"import sys, {', '.join(imports)}\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & set({watched!r})))"
    return eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


def test_importing_the_trainer_library_imports_no_training_framework():
    assert loaded(LIBRARY, FRAMEWORKS) == []


def test_the_probe_sees_what_the_library_does_import():
    assert loaded(LIBRARY, ("torch", *FRAMEWORKS)) == ["torch"]
