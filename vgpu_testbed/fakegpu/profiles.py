"""Machine profiles for the simulated GPUs: the YAML files under `hack/fakegpu/profiles/`.

A profile describes one node's GPUs (product, memory, SMs, identity, PCI placement, NUMA node,
NVLink links) and its driver. This module loads and validates profiles strictly, so that a typo
or an impossible machine is an error naming the profile, the GPU and the field instead of a
simulated node that silently differs from what a test meant. `vgpu_testbed.fakegpu.simulator` turns
a validated profile into the text file the C libraries read; tests use the profile as ground truth.

YAML shape (see the shipped profiles):
    name, description, driver_version, cuda_driver_version (e.g. 13000 for 13.0)
    gpu_defaults: fields merged into every GPU (a GPU's own fields win)
    nvlink_domains: [{gpus: [...], links_per_peer: N}]  every pair in a domain gets N links
    gpus: [{product, brand, architecture, compute_capability, memory_bytes, sm_count, uuid, ...}]
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROFILES_DIR = Path(__file__).resolve().parents[2] / "hack" / "fakegpu" / "profiles"

MAX_GPUS = 16  # SIM_MAX_GPUS in hack/fakegpu/include/simstate.h
MAX_NVLINKS = 18  # SIM_MAX_LINKS

Brand = Literal[
    "nvidia", "tesla", "quadro", "geforce", "titan", "nvs", "grid", "quadro_rtx", "nvidia_rtx"
]
Architecture = Literal[
    "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"
]

UUID_PATTERN = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
BUS_ID_PATTERN = r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$"
PCIE_ROOT_PATTERN = r"^pci[0-9a-f]{4}:[0-9a-f]{2}$"


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message names the profile, GPU and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class NvLink(_Strict):
    """`links` NVLink links from this GPU to GPU `peer` (index in the profile)."""

    peer: Annotated[int, Field(ge=0)]
    links: Annotated[int, Field(ge=1, le=MAX_NVLINKS)]


class NvLinkDomain(_Strict):
    """GPUs all linked to each other (an NVSwitch fabric or a fully connected island)."""

    gpus: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2)]
    links_per_peer: Annotated[int, Field(ge=1, le=MAX_NVLINKS)]


class GpuSpec(_Strict):
    """One physical GPU of a simulated node."""

    product: Annotated[str, Field(min_length=1, max_length=95)]
    brand: Brand
    architecture: Architecture
    compute_capability: Annotated[str, Field(pattern=r"^[1-9][0-9]?\.[0-9]$")]
    memory_bytes: Annotated[int, Field(gt=0)]
    sm_count: Annotated[int, Field(gt=0, le=1024)]
    cores_per_sm: Annotated[int, Field(gt=0, le=1024)] = 128
    uuid: Annotated[str, Field(pattern=UUID_PATTERN)]
    serial: Annotated[str, Field(min_length=1, max_length=29)]
    pci_bus_id: Annotated[str, Field(pattern=BUS_ID_PATTERN)]
    pcie_root: Annotated[str, Field(pattern=PCIE_ROOT_PATTERN)]
    pci_device_id: Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
    pci_subsystem_id: Annotated[int, Field(ge=0, le=0xFFFFFFFF)] = 0
    minor: Annotated[int, Field(ge=0, le=255)]
    numa_node: Annotated[int, Field(ge=-1, le=63)]
    mig_capable: bool = False
    power_limit_w: Annotated[int, Field(gt=0, le=5000)] = 300
    max_sm_clock_mhz: Annotated[int, Field(gt=0)] = 1980
    max_mem_clock_mhz: Annotated[int, Field(gt=0)] = 2619
    memory_bus_width: Annotated[int, Field(gt=0)] = 5120
    nvlink: list[NvLink] = []

    @property
    def name(self) -> str:
        """NVML's device name (the product name)."""
        return self.product

    @property
    def nvlink_peers(self) -> list[int]:
        return [link.peer for link in self.nvlink]

    @property
    def nvlink_count(self) -> int:
        return sum(link.links for link in self.nvlink)


class Profile(_Strict):
    """A validated machine profile; `gpus` are in NVML index order with NVLink expanded."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,62}$")]
    description: str = ""
    driver_version: Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){1,2}$")]
    cuda_driver_version: Annotated[int, Field(ge=1000, le=99990)]
    gpus: Annotated[list[GpuSpec], Field(max_length=MAX_GPUS)]

    @property
    def cuda_version(self) -> str:
        """The CUDA driver version as "major.minor" (13000 -> "13.0")."""
        return f"{self.cuda_driver_version // 1000}.{self.cuda_driver_version % 1000 // 10}"


class _ProfileFile(_Strict):
    """The YAML document before defaults and NVLink domains are applied."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    name: str
    description: str = ""
    driver_version: str
    cuda_driver_version: int
    gpu_defaults: dict[str, Any] = {}
    nvlink_domains: list[NvLinkDomain] = []
    gpus: list[dict[str, Any]]


def _where(loc: tuple[int | str, ...]) -> str:
    """`("gpus", 3, "uuid")` -> `gpu 3: field 'uuid'`, for error messages."""
    parts = list(loc)
    prefix = ""
    if len(parts) >= 2 and parts[0] == "gpus" and isinstance(parts[1], int):
        prefix = f"gpu {parts[1]}: "
        parts = parts[2:]
    field = ".".join(str(p) for p in parts)
    return f"{prefix}field '{field}'" if field else prefix.rstrip(": ")


def _format(source: str, error: ValidationError) -> ProfileError:
    problems = [f"{_where(e['loc'])}: {e['msg']}" for e in error.errors()]
    return ProfileError(f"profile {source}: " + "; ".join(problems))


def _expand(doc: _ProfileFile, source: str) -> dict[str, Any]:
    """Merge gpu_defaults into each GPU and add the NVLink domains' links."""
    gpus: list[dict[str, Any]] = [{**doc.gpu_defaults, **gpu} for gpu in doc.gpus]
    for d, domain in enumerate(doc.nvlink_domains):
        for index in domain.gpus:
            if index >= len(gpus):
                raise ProfileError(
                    f"profile {source}: nvlink_domains[{d}]: GPU {index} does not exist "
                    f"(the profile has {len(gpus)} GPUs)"
                )
        if len(set(domain.gpus)) != len(domain.gpus):
            raise ProfileError(f"profile {source}: nvlink_domains[{d}]: a GPU is listed twice")
        for index in domain.gpus:
            links = list(gpus[index].get("nvlink", []))
            links += [
                {"peer": peer, "links": domain.links_per_peer}
                for peer in domain.gpus
                if peer != index
            ]
            gpus[index]["nvlink"] = links
    return {
        "name": doc.name,
        "description": doc.description,
        "driver_version": doc.driver_version,
        "cuda_driver_version": doc.cuda_driver_version,
        "gpus": gpus,
    }


def _consistency_errors(profile: Profile) -> list[str]:
    """Cross-GPU checks a single field cannot express."""
    errors: list[str] = []
    for field in ("uuid", "pci_bus_id", "minor", "serial"):
        values = Counter(
            str(getattr(g, field)).lower() if field == "pci_bus_id" else getattr(g, field)
            for g in profile.gpus
        )
        for i, gpu in enumerate(profile.gpus):
            value = getattr(gpu, field)
            key = str(value).lower() if field == "pci_bus_id" else value
            if values[key] > 1:
                errors.append(f"gpu {i}: field '{field}': duplicate value {value!r}")
    count = len(profile.gpus)
    for i, gpu in enumerate(profile.gpus):
        peers = Counter(link.peer for link in gpu.nvlink)
        for peer, times in peers.items():
            if times > 1:
                errors.append(f"gpu {i}: field 'nvlink': peer {peer} listed {times} times")
        if gpu.nvlink_count > MAX_NVLINKS:
            errors.append(
                f"gpu {i}: field 'nvlink': {gpu.nvlink_count} links, at most {MAX_NVLINKS}"
            )
        for link in gpu.nvlink:
            if link.peer == i:
                errors.append(f"gpu {i}: field 'nvlink': a link to itself")
            elif link.peer >= count:
                errors.append(
                    f"gpu {i}: field 'nvlink': peer {link.peer} does not exist "
                    f"(the profile has {count} GPUs)"
                )
            else:
                back = sum(x.links for x in profile.gpus[link.peer].nvlink if x.peer == i)
                if back != link.links:
                    errors.append(
                        f"gpu {i}: field 'nvlink': {link.links} links to GPU {link.peer}, "
                        f"but GPU {link.peer} has {back} links back (links must be symmetric)"
                    )
    return errors


def parse_profile(text: str, source: str = "<string>") -> Profile:
    """Validate a profile given as YAML text; raises ProfileError."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {source}: expected a mapping at the top level")
    try:
        doc = _ProfileFile.model_validate(raw)
    except ValidationError as exc:
        raise _format(source, exc) from exc
    label = f"{source} ({doc.name})" if doc.name not in source else source
    expanded = _expand(doc, label)
    try:
        profile = Profile.model_validate(expanded, strict=False)
    except ValidationError as exc:
        raise _format(label, exc) from exc
    errors = _consistency_errors(profile)
    if errors:
        raise ProfileError(f"profile {label}: " + "; ".join(errors))
    return profile


def profile_names() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name (`dgx-h100`) or any profile file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml") and not path.exists():
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", str(name_or_path)):
            raise ProfileError(f"profile {name_or_path!r}: not a profile name or YAML file")
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(profile_names())
            raise ProfileError(f"profile {name_or_path!r}: no such profile (known: {known})")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"profile {path}: cannot read: {exc.strerror}") from exc
    return parse_profile(text, source=str(name_or_path))
