#!/usr/bin/env bash
# Builds etcd, kube-apiserver and Kueue's manager for the Kueue tests (tests/kueue,
# allmende/testing/kubernetes.py) from the Go module proxy, into infra/kubernetes/bin/:
#   etcd            go.etcd.io/etcd/server/v3 v3.6.8                      (etcd/go.mod)
#   kube-apiserver  k8s.io/kubernetes/cmd/kube-apiserver v1.35.3          (apiserver/go.mod)
#   kueue           sigs.k8s.io/kueue/cmd/kueue v0.17.0                   (kueue/go.mod)
# and copies Kueue's CRDs and webhook manifests (config/components/{crd,webhook} of the Kueue
# module: the CRDs are in crd/bases) into bin/kueue-config/.
#
# Each binary is built in its module with the versions of the committed go.mod/go.sum
# (-mod=readonly: a go.mod that needs changing is an error, not an edit). A binary newer than its
# go.mod and go.sum is kept. Cold Go caches: about 8 minutes on 2 cores (kube-apiserver the
# longest), then about 5 GB in the Go caches. GO=/path/to/go to choose the Go (1.25+).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/bin"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
# apiserver/go.mod's k8s.io/kubernetes: what /version says (Kueue checks it)
KUBERNETES_VERSION="$(sed -n 's|^[[:space:]]*k8s.io/kubernetes \(v[0-9.]*\).*|\1|p' "$here/apiserver/go.mod")"
: "${KUBERNETES_VERSION:?no k8s.io/kubernetes in apiserver/go.mod}"
IFS=. read -r major minor _ <<<"${KUBERNETES_VERSION#v}"

mkdir -p "$bin"

# build NAME MODULE_DIR PACKAGE [go build flags...]
build() {
	local name="$1" module="$here/$2" package="$3"
	shift 3
	local out="$bin/$name"
	if [[ -x "$out" && "$out" -nt "$module/go.mod" && "$out" -nt "$module/go.sum" ]]; then
		echo "$name: up to date ($out)"
		return
	fi
	echo "$name: building $package ..."
	local started=$SECONDS
	(cd "$module" && "$GO" build -mod=readonly -trimpath "$@" -o "$out.tmp" "$package")
	mv -f "$out.tmp" "$out"
	echo "$name: built in $((SECONDS - started))s ($(du -m "$out" | cut -f1) MB)"
}

build etcd etcd go.etcd.io/etcd/server/v3
# Without the version, /version says v0.0.0-master and Kueue refuses to start.
version=k8s.io/component-base/version
build kube-apiserver apiserver k8s.io/kubernetes/cmd/kube-apiserver -ldflags \
	"-X $version.gitVersion=$KUBERNETES_VERSION -X $version.gitMajor=$major -X $version.gitMinor=$minor"
build kueue kueue sigs.k8s.io/kueue/cmd/kueue

# Kueue's manifests, from the module the binary was built from (downloaded if the build was cached).
kueue_dir="$(cd "$here/kueue" && "$GO" mod download sigs.k8s.io/kueue &&
	"$GO" list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
# crd/: bases/ (the CRDs), kustomization.yaml and patches/ (which CRDs get the conversion webhook);
# webhook/: manifests.yaml (the webhook configurations), kustomization.yaml (their patches).
config="$bin/kueue-config"
rm -rf "$config"
mkdir -p "$config"
cp -R "$kueue_dir/config/components/crd" "$kueue_dir/config/components/webhook" "$config/"
chmod -R u+w "$config"  # the module cache's files are read-only
echo "kueue-config: $(ls "$config/crd/bases" | wc -l) CRDs and the webhook manifests of $kueue_dir"
