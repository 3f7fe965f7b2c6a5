"""Regenerate the checked-in Python modules of core/_engine/protos/*.proto; ``--check`` only verifies them.

Use grpcio-tools==1.76.0 (bundled protoc 31.1, matching the protobuf 6.x runtime that
tritonclient's ``protobuf<7`` pin allows), so the output is reproducible:

    python scripts/generate_protos.py          # rewrite core/_engine/protos/*_pb2*.py and the *_pb2.pyi stubs
    python scripts/generate_protos.py --check  # exit 1 if they are stale (for CI)

Post-processing applied to protoc's output:
  * descriptors go to the private pool ``triton_serve._engine.protos.POOL`` instead of protobuf's
    default pool, so our ``inference.*`` types never clash with tritonclient's copies;
  * ``import x_pb2`` becomes ``from triton_serve._engine.protos import x_pb2`` and message classes
    get their full module name, so the modules work (and pickle) inside the package.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

GRPC_TOOLS_VERSION = "1.76.0"
PACKAGE = "triton_serve._engine.protos"
PROTO_DIR = Path(__file__).resolve().parent.parent / "core" / "_engine" / "protos"
PROTOS = ("model_config.proto", "grpc_service.proto", "health.proto")
OUTPUTS = (
    "model_config_pb2.py",
    "model_config_pb2.pyi",
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "grpc_service_pb2_grpc.py",
    "health_pb2.py",
    "health_pb2.pyi",
    "health_pb2_grpc.py",
)

_POOL_IMPORT = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
_POOL_CALL = "_descriptor_pool.Default().AddSerializedFile("
_LOCAL_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def run_protoc(out_dir: Path) -> None:
    """Run grpc_tools' protoc on all schemas, writing raw modules into ``out_dir``."""
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
        f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *PROTOS,
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_DIR)


def replace_once(source: str, old: str, new: str) -> str:
    """Replace exactly one occurrence of ``old``; fail loudly if protoc's output changed shape."""
    if source.count(old) != 1:
        raise RuntimeError(f"expected exactly one {old!r} in generated code")
    return source.replace(old, new)


def use_private_pool(source: str, module: str) -> str:
    """Register the file in ``triton_serve._engine.protos.POOL`` and name classes by full module path."""
    source = replace_once(source, _POOL_IMPORT, f"from {PACKAGE} import POOL as _POOL\n")
    source = replace_once(source, _POOL_CALL, "_POOL.AddSerializedFile(")
    return replace_once(
        source, f"(DESCRIPTOR, '{module}', _globals)", f"(DESCRIPTOR, '{PACKAGE}.{module}', _globals)"
    )


def postprocess(name: str, source: str) -> str:
    """Apply the package-relative import rewrite, and the pool rewrite to ``*_pb2.py``."""
    source = _LOCAL_IMPORT.sub(rf"from {PACKAGE} import \1 as \2", source)
    if name.endswith("_pb2.py"):
        source = use_private_pool(source, name.removesuffix(".py"))
    return source


def generate() -> dict[str, str]:
    """Return the final text of every output module, keyed by file name."""
    with tempfile.TemporaryDirectory() as tmp:
        run_protoc(Path(tmp))
        return {name: postprocess(name, (Path(tmp) / name).read_text()) for name in OUTPUTS}


def stale_files(generated: dict[str, str]) -> list[str]:
    """Names of checked-in modules that are missing or differ from ``generated``."""
    return [
        name for name, text in generated.items()
        if not (PROTO_DIR / name).is_file() or (PROTO_DIR / name).read_text() != text
    ]


def check_tool_version() -> None:
    """Refuse to run with another grpcio-tools, whose output would differ."""
    found = metadata.version("grpcio-tools")
    if found != GRPC_TOOLS_VERSION:
        sys.exit(f"grpcio-tools=={GRPC_TOOLS_VERSION} required, found {found}")


def main(argv: list[str] | None = None) -> int:
    """Regenerate (default) or verify (``--check``) the generated modules."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if checked-in files are stale")
    args = parser.parse_args(argv)
    check_tool_version()
    generated = generate()
    stale = stale_files(generated)
    if args.check:
        for name in stale:
            print(f"stale: core/_engine/protos/{name}", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        (PROTO_DIR / name).write_text(generated[name])
        print(f"wrote core/_engine/protos/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
