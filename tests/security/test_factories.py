"""The factory rule: nothing a manifest names is imported or called unless the rule admits it.

A manifest is written by whoever can write the catalog or the store; ``pull`` reads its
``architecture.factory``. These tests push manifests with hostile factories through the public
API (push records any ``module:callable`` string) and pull them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import registry
from registry.errors import ArchitectureUnknownError, RegistryError, UntrustedFactoryError
from registry.model.factories import resolve_factory
from tests.helpers import MLP, trained_mlp

TRUSTED = ("torchvision.models", "timm")


def _push_with_factory(reg: registry.Registry, name: str, factory: str,
                       kwargs: dict[str, object] | None = None) -> None:
    # Push accepts any module:callable string; what pull does with it is the rule under test.
    reg.push(trained_mlp(), name, factory=factory, factory_kwargs=kwargs)


@pytest.fixture
def recorder(work: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module on sys.path that appends to a file whenever it is imported, and defines an
    nn.Module subclass (so only "not imported yet" keeps it out)."""
    log = work / "imported.log"
    package = work / "pkgs"
    package.mkdir()
    (package / "recorder_mod.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(log)!r}).open('a').write('imported\\n')\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1 = nn.Linear(8, 16)\n"
    )
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.delitem(sys.modules, "recorder_mod", raising=False)
    return log


def test_refused_factory_imports_nothing(reg: registry.Registry, recorder: Path) -> None:
    _push_with_factory(reg, "rec", "recorder_mod:Net")
    with pytest.raises(UntrustedFactoryError, match="not imported"):
        reg.pull("rec", device="cpu")
    assert not recorder.exists(), "the module of a refused factory was imported"
    assert "recorder_mod" not in sys.modules


def test_recorder_module_is_admitted_once_the_user_imported_it(reg: registry.Registry,
                                                               recorder: Path) -> None:
    """The control for the test above: the recorder does record an import, and an nn.Module
    subclass of a module the user imported is admitted."""
    import recorder_mod  # noqa: F401

    assert recorder.read_text() == "imported\n"
    target = resolve_factory("recorder_mod:Net", TRUSTED)
    assert issubclass(target, nn.Module)
    assert recorder.read_text() == "imported\n", "resolving imported it a second time"


def test_this_zen_imports_nothing(reg: registry.Registry) -> None:
    assert "this" not in sys.modules
    _push_with_factory(reg, "zen", "this:Zen")
    with pytest.raises(UntrustedFactoryError):
        reg.pull("zen", device="cpu")
    assert "this" not in sys.modules


@pytest.mark.parametrize("factory", ["timm:models._hub.os.system",
                                     "torchvision.models:_api.importlib.import_module"])
def test_private_hops_through_trusted_packages_are_refused(
        reg: registry.Registry, factory: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    _push_with_factory(reg, "hop", factory, {"command": "touch pwned"})
    with pytest.raises(UntrustedFactoryError, match="public names"):
        reg.pull("hop", device="cpu")
    assert calls == []


@pytest.mark.parametrize("factory", ["timm:models.create_model", "timm:layers.os.system",
                                     "torchvision.models:resnet.torch.load"])
def test_module_objects_on_the_path_are_refused(factory: str) -> None:
    with pytest.raises(UntrustedFactoryError, match="reaches module"):
        resolve_factory(factory, TRUSTED)


@pytest.mark.parametrize("factory", [
    "", "os", ":system", "os:", "os::system", "a..b:c", "a:b..c", "a:1b", "1a:b", "a b:c",
    "a:b:c", "a:b()", "os:system;id", "a:b/c", "./x:y", "../x:y", "a:__class__", "_a:b",
    "a._b:c", "a:b._c", "x" * 400 + ":y", "a:b\n", "torchvision.models:resnet18 ",
])
def test_malformed_factory_strings_are_refused_before_import(factory: str) -> None:
    before = set(sys.modules)
    with pytest.raises(UntrustedFactoryError):
        resolve_factory(factory, TRUSTED)
    assert set(sys.modules) == before


@pytest.mark.parametrize("factory", ["subprocess:Popen", "os:system", "builtins:eval",
                                     "tests.helpers:make_mlp", "torch:load",
                                     "torchvision.modelsevil:x", "timmx:create_model"])
def test_imported_non_module_classes_and_functions_are_refused(factory: str) -> None:
    import subprocess  # noqa: F401  (imported: refused anyway, it is not an nn.Module)

    with pytest.raises(UntrustedFactoryError):
        resolve_factory(factory, TRUSTED)


def test_pretrained_downloads_are_refused(reg: registry.Registry, work: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A trusted factory asked for pretrained weights would download into a cache outside the
    registry (torch hub, Hugging Face); the rule refuses before it runs."""
    monkeypatch.setenv("TORCH_HOME", str(work / "torch-home"))
    monkeypatch.setenv("HF_HOME", str(work / "hf-home"))
    tv = pytest.importorskip("torchvision.models")
    reg.push(tv.resnet18(num_classes=3), "tv", factory="torchvision.models:resnet18",
             factory_kwargs={"num_classes": 3, "weights": "DEFAULT"})
    with pytest.raises(UntrustedFactoryError, match="weights="):
        reg.pull("tv", device="cpu")
    timm = pytest.importorskip("timm")
    reg.push(timm.create_model("test_resnet", num_classes=3), "tm",
             factory="timm:create_model",
             factory_kwargs={"model_name": "test_resnet", "num_classes": 3, "pretrained": True})
    with pytest.raises(UntrustedFactoryError, match="pretrained="):
        reg.pull("tm", device="cpu")
    assert not (work / "torch-home").exists() and not (work / "hf-home").exists()


def test_trusted_factories_keep_working(reg: registry.Registry) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=3).eval()
    reg.push(model, "timm-net", factory="timm:create_model",
             factory_kwargs={"model_name": "test_resnet", "num_classes": 3, "pretrained": False})
    pulled = reg.pull("timm-net", device="cpu")
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(pulled(x), model(x))
    tv = pytest.importorskip("torchvision.models")
    reg.push(tv.resnet18(num_classes=3), "tv-net", factory="torchvision.models:resnet18",
             factory_kwargs={"num_classes": 3, "weights": None})
    assert type(reg.pull("tv-net", device="cpu")).__name__ == "ResNet"


def test_module_subclass_of_an_imported_module_is_admitted(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "mlp", factory=MLP)
    assert isinstance(reg.pull("mlp", device="cpu"), MLP)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.text(max_size=80),
    st.from_regex(r"[a-z_][a-z0-9_.]{0,20}:[A-Za-z_][A-Za-z0-9_.]{0,20}", fullmatch=True),
    st.sampled_from(["timm", "torchvision.models", "os", "sys", "subprocess", "importlib"])
      .flatmap(lambda m: st.from_regex(r"[A-Za-z_.]{1,30}", fullmatch=True)
               .map(lambda q: f"{m}:{q}")),
))
def test_fuzzed_factories_import_nothing_new_and_fail_typed(factory: str) -> None:
    import timm  # noqa: F401  (imported up front: only imports *caused by the factory* count)
    import torchvision.models  # noqa: F401

    before = set(sys.modules)
    try:
        target = resolve_factory(factory, TRUSTED)
    except RegistryError:
        target = None
    new = set(sys.modules) - before
    # Only submodules of a trusted package may be imported, and only by a trusted factory.
    assert all(m.startswith(("timm.", "torchvision.models.")) for m in new), new
    if target is not None:
        assert factory.partition(":")[0].startswith(TRUSTED) or (
            isinstance(target, type) and issubclass(target, nn.Module))
    assert not isinstance(target, type(os))


def test_cli_pull_of_a_hostile_factory_never_builds(reg: registry.Registry, home: Path) -> None:
    """`registry pull -o` writes weights only: the factory of the manifest is never touched."""
    from tests.helpers import clean_env, run_cli

    _push_with_factory(reg, "cli", "timm:models._hub.os.system", {"command": "touch pwned"})
    out = run_cli("pull", "cli", "--device", "cpu", "-o", str(home / "out.safetensors"),
                  env=clean_env(home))
    assert out.returncode == 0, out.stderr
    assert not (home / "pwned").exists()


def test_trusted_module_that_is_not_installed_is_architecture_unknown() -> None:
    with pytest.raises(ArchitectureUnknownError, match="cannot be imported"):
        resolve_factory("timm.no_such_module:Net", TRUSTED)


_SCRIPT_NET = """
import sys, warnings
import torch
from torch import nn
import registry

class MyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
"""


def _script(tmp: Path, name: str, body: str, home: Path) -> subprocess.CompletedProcess[str]:
    path = tmp / name
    path.write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    env.update(REGISTRY_HOME=str(home), PYTHONWARNINGS="default")
    return subprocess.run([sys.executable, str(path)], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=300)


def test_a_class_of_the_users_script_is_recorded_as_main_with_a_warning_naming_the_fix(
        work: Path, home: Path) -> None:
    tmp_path = work  # the scripts live where the outside-the-home sentinel does not look
    pushed = _script(tmp_path, "train.py", _SCRIPT_NET + """
torch.manual_seed(0)
mv = registry.push(MyNet(), "mynet", factory=MyNet)
print(mv.metadata["architecture"]["factory"])
""", home)
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == "__main__:MyNet"
    warned = [line for line in pushed.stderr.splitlines() if "UserWarning" in line]
    assert len(warned) == 1, pushed.stderr
    assert warned[0].startswith(f"{tmp_path / 'train.py'}:"), warned  # the user's line
    assert "only a process whose __main__ defines MyNet can pull it" in warned[0]
    assert "factory='yourmodule:MyNet'" in warned[0]

    # A process whose __main__ defines the class pulls it without model=.
    again = _script(tmp_path, "serve.py", _SCRIPT_NET + """
model = registry.pull("mynet")
torch.manual_seed(0)
assert type(model) is MyNet and torch.equal(model.fc.weight, MyNet().fc.weight)
print("pulled", type(model).__name__)
""", home)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "pulled MyNet"

    # One without it is told what is missing, and nothing is imported or built.
    elsewhere = _script(tmp_path, "other.py", """
import registry
from registry.errors import ArchitectureUnknownError
try:
    registry.pull("mynet")
except ArchitectureUnknownError as exc:
    print(exc)
""", home)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "'__main__:MyNet' does not exist in __main__" in elsewhere.stdout
    assert "pass model=" in elsewhere.stdout


def test_a_main_factory_never_reaches_past_the_class(reg: registry.Registry) -> None:
    for factory in ("__main__:sys", "__main__:__builtins__", "__main__._x:Y", "__mainx__:Y"):
        with pytest.raises((UntrustedFactoryError, ArchitectureUnknownError)):
            resolve_factory(factory, ())
