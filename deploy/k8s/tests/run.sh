#!/usr/bin/env bash
# Offline validation of the Kubernetes manifests (deploy/k8s): renders every
# kustomization (our kustomize subset; also `kubectl kustomize` when kubectl is
# installed, and both must agree), validates every object with
# kubernetes-validate --strict against a pinned Kubernetes version, checks the
# monitoring objects, policies and the Dockerfile. Needs only python3 + pip
# (PyPI reachable). Called by .ci/run. Exits non-zero on any failure, and on
# "no tests ran".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
req="$here/requirements.txt"
venv="$target/k8s-venv"
pydeps="$target/k8s-pydeps"
want="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$req")"
pip_flags=(--disable-pip-version-check --no-input -q)

py=""
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    py="$venv/bin/python"
elif [ -d "$pydeps" ] && [ "$(cat "$pydeps/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    py="python3"
    export PYTHONPATH="$pydeps${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "==> installing $(basename "$req") into $target"
    rm -rf "$venv" "$pydeps"
    mkdir -p "$target"
    if python3 -m venv "$venv" >/dev/null 2>&1 && [ -x "$venv/bin/python" ]; then
        timeout 900 "$venv/bin/python" -m pip install "${pip_flags[@]}" -r "$req"
        echo "$want" > "$venv/.requirements.sha256"
        py="$venv/bin/python"
    else
        # No venv module (e.g. Debian without python3-venv): a private target
        # directory, which pip allows even on an externally managed Python.
        rm -rf "$venv"
        timeout 900 python3 -m pip install "${pip_flags[@]}" --target "$pydeps" -r "$req"
        echo "$want" > "$pydeps/.requirements.sha256"
        py="python3"
        export PYTHONPATH="$pydeps${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi

if command -v kubectl >/dev/null 2>&1; then
    echo "==> kubectl found: renders are compared with \`kubectl kustomize\`"
else
    echo "==> kubectl not found: rendering with deploy/k8s/tests/kustomize_lite.py only"
fi

# No caches or bytecode in the source tree.
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
set +e
timeout 900 "$py" -m pytest -q -rsx -p no:cacheprovider "$here"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "deploy/k8s/tests: no tests ran" >&2
fi
exit "$rc"
