"""Checks that every workspace crate imports only from its own room or the rooms below it, and
prints the rooms with each crate's imports. Reads `cargo metadata` (no build); normal
dependencies only (dev-dependencies may reach anywhere). Exits 1 on an upward import or a
crate no room names. `--self-test` checks that an upward import is caught.

    python3 tools/layers.py [--self-test]
"""

import json
import subprocess
import sys

# Bottom to top. A crate may import from its own room (Cargo refuses circles) and below.
ROOMS = [
    ("foundations", ["ssl-core", "ssl-linalg", "ssl-data", "ssl-eval", "ssl-report", "ssl-net"]),
    ("ops", ["ssl-models", "ssl-masking", "ssl-dist", "ssl-optim"]),
    ("objectives", None),  # every crate under objectives/ and the out-of-tree example's
    ("training", ["ssl-train"]),
    ("studies", ["ssl-experiments"]),
    ("publishing", ["ssl-hub"]),
    ("doors", ["ssl", "ssl-python", "ssl-examples", "ssl-plugin-cli"]),
]


def room_of(package):
    for level, (name, crates) in enumerate(ROOMS):
        if crates is None:
            path = package["manifest_path"]
            if "/objectives/" in path or package["name"] == "ssl-plugin-objective":
                return level, name
        elif package["name"] in crates:
            return level, name
    return None, None


def main():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        check=True, capture_output=True, text=True).stdout)
    packages = {p["name"]: p for p in meta["packages"]}
    if "--self-test" in sys.argv[1:]:
        packages["ssl-core"]["dependencies"].append({"name": "ssl-train", "kind": None})
    problems, by_room = [], {}
    for name, package in sorted(packages.items()):
        level, room = room_of(package)
        if level is None:
            problems.append(f"{name}: no room names it (add it to ROOMS)")
            continue
        imports = sorted({d["name"] for d in package["dependencies"]
                          if d["name"] in packages and d["kind"] is None})
        by_room.setdefault(level, []).append((name, imports))
        for dep in imports:
            dep_level, dep_room = room_of(packages[dep])
            if dep_level is not None and dep_level > level:
                problems.append(f"{name} ({room}) imports {dep} ({dep_room}), a room above it")
    for level, (room, _) in enumerate(ROOMS):
        print(f"{level} {room}")
        for name, imports in by_room.get(level, []):
            print(f"    {name}" + (f" -> {', '.join(imports)}" if imports else ""))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if "--self-test" in sys.argv[1:]:
        caught = any("ssl-core (foundations) imports ssl-train" in p for p in problems)
        print("self-test:", "the upward import was caught" if caught else "NOT caught")
        sys.exit(0 if caught else 1)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
