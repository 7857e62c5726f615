"""pipeline.kernels.versions: the kernels refuse a torch or transformers outside the verified ranges."""
from importlib import metadata

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.kernels.versions import TORCH_VERIFIED, TRANSFORMERS_VERIFIED, check_kernel_versions


def _versions(**found):
    """An installed_version lookup: the real one, except for the packages named (None: not installed)."""
    def lookup(package):
        if package not in found:
            return metadata.version(package)
        if found[package] is None:
            raise metadata.PackageNotFoundError(package)
        return found[package]
    return lookup


def test_the_installed_torch_and_transformers_pass():
    check_kernel_versions()


@pytest.mark.parametrize("torch_version", ["2.12.0", "2.12.1+cu128", "2.13.0", "2.13.0+cpu",
                                           "2.13.2+cu128", "2.13.1rc1"])
def test_any_release_of_a_verified_minor_passes(torch_version):
    check_kernel_versions(installed_version=_versions(torch=torch_version))


@pytest.mark.parametrize("torch_version", ["2.14.0", "2.14.0rc1", "2.11.0", "2.11.0+cu130", "3.0.0", "2.12.0a0"])
def test_a_torch_outside_the_range_is_refused_naming_package_version_and_range(torch_version):
    with pytest.raises(ConfigError) as error:
        check_kernel_versions(installed_version=_versions(torch=torch_version))
    cpu = TORCH_VERIFIED["cpu"]
    assert error.value.problems == [
        f"torch {torch_version} is installed, but the int8 and batch-invariant kernels (pipeline/kernels) use its "
        f"private APIs and were verified only with torch{cpu}: install torch{cpu}"]


@pytest.mark.parametrize("torch_version, cpu, cuda", [("2.11.0+cu130", False, True), ("2.13.0", True, False),
                                                      ("2.10.0", False, False), ("2.14.0", False, False)])
def test_the_range_is_the_device_s(torch_version, cpu, cuda):
    """CUDA's kernels were verified on the GPU image's 2.11 only, where the CPU's oneDNN product is not
    row-invariant."""
    for device, accepted in (("cpu", cpu), ("cuda", cuda), ("cuda:0", cuda)):
        try:
            check_kernel_versions(device, installed_version=_versions(torch=torch_version))
        except ConfigError:
            assert not accepted, (device, torch_version)
        else:
            assert accepted, (device, torch_version)


def test_both_packages_outside_are_two_lines_and_a_missing_or_odd_version_is_refused():
    with pytest.raises(ConfigError) as error:
        check_kernel_versions(installed_version=_versions(torch="2.10.0", transformers="6.0.0"))
    assert [p.split(" is installed")[0] for p in error.value.problems] == ["torch 2.10.0", "transformers 6.0.0"]
    assert TRANSFORMERS_VERIFIED in error.value.problems[1]
    with pytest.raises(ConfigError, match=r"^transformers is not installed: the kernels need transformers>="):
        check_kernel_versions(installed_version=_versions(transformers=None))
    with pytest.raises(ConfigError, match=r"^torch not-a-version is installed"):
        check_kernel_versions(installed_version=_versions(torch="not-a-version"))


@pytest.mark.parametrize("variant", ["float32", "bfloat16", "int8-dynamic", "int8-weight"])
def test_every_variant_checks_the_versions_before_converting(monkeypatch, variant):
    from pipeline import precision

    def refuse(device):
        raise ConfigError("refused")

    monkeypatch.setattr(precision, "check_kernel_versions", refuse)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))  # every variant swaps Linears (row-invariant or int8)
    with pytest.raises(ConfigError, match="refused"):
        precision.apply_precision(model, variant)
    assert type(model[0]) is torch.nn.Linear  # refused before any Linear was replaced
