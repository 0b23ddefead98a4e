#!/usr/bin/env bash
# Builds CRIU and its Python bindings (pycriu) from Debian's source tarball, for machines whose
# distribution has no working CRIU >= 4 (Debian 12's 3.17 fails on recent kernels: "vdso: Unexpected
# rt vDSO area bounds"). Debian/Ubuntu, as root (it installs the build dependencies with apt).
#   scripts/build-criu.sh        prints the install prefix on its last line of stdout:
#     PREFIX/bin/criu            the criu binary (the compiled-in plugin dir stays /usr/lib/criu)
#     PREFIX/python/pycriu       the pycriu package (imports protobuf, from PyPI)
# PREFIX is .criu/<version> in the checkout (ignored by git). A second run finds it and does nothing.
# The tarball is kept in .criu/src; the build log of the last build is .criu/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.2.1
deb_version=$version-1   # the Debian source package that carries this tarball (unstable)
tarball=criu_$version.orig.tar.xz
tarball_sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
cache=$PWD/.criu
prefix=$cache/$version

if [ -x "$prefix/bin/criu" ] && [ -f "$prefix/python/pycriu/__init__.py" ]; then
  echo "$prefix"
  exit 0
fi

say() { echo "build-criu: $*" >&2; }

install_build_deps() {
  local deps=(gcc make libc6-dev pkg-config python3 xz-utils debian-archive-keyring
              libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler libnl-3-dev
              libcap-dev libnet1-dev libbsd-dev libgnutls28-dev libnftables-dev libaio-dev uuid-dev)
  local missing=()
  for d in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'ok installed' || missing+=("$d")
  done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing build dependencies: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# The tarball comes through apt from Debian unstable's source index (signed; apt checks the hash),
# with a throw-away sources list so the machine's apt configuration is untouched. Only the upstream
# tarball is needed: the Debian packaging files are not (and are not always on the mirror).
download_tarball() {
  local mirror state
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' \
             /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  state=$(mktemp -d)
  mkdir -p "$state/lists/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" \
    >"$state/sources.list"
  local apt_opts=(-o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o Dir::State::Lists="$state/lists" -o Debug::NoLocking=1
                  -o APT::Sandbox::User=root)
  say "downloading criu $deb_version source from $mirror (sid)"
  # apt reports the missing packaging files as an error: its status and output only matter when
  # the tarball did not arrive.
  (cd "$state" && apt-get "${apt_opts[@]}" update -qq &&
     apt-get "${apt_opts[@]}" source -q --download-only "criu=$deb_version") >"$state/apt.log" 2>&1 || true
  if [ ! -f "$state/$tarball" ]; then
    cat "$state/apt.log" >&2
    rm -rf "$state"
    say "could not download $tarball (is criu $deb_version still in Debian unstable?)"
    exit 1
  fi
  mkdir -p "$cache/src"
  mv "$state/$tarball" "$cache/src/$tarball"
  rm -rf "$state"
}

install_build_deps
[ -f "$cache/src/$tarball" ] || download_tarball
echo "$tarball_sha256  $cache/src/$tarball" | sha256sum -c --quiet - >&2 ||
  { rm -f "$cache/src/$tarball"; say "$tarball has the wrong checksum; removed it, run again"; exit 1; }

build=$cache/build
rm -rf "$build" "$prefix.partial"
mkdir -p "$build"
tar -xJf "$cache/src/$tarball" -C "$build"
src=$build/criu-$version
say "building criu $version (log: $cache/build.log)"
if ! { make -C "$src" -j"$(nproc)" criu && make -C "$src" lib; } >"$cache/build.log" 2>&1; then
  tail -n 20 "$cache/build.log" >&2
  say "build failed; the whole log is $cache/build.log"
  exit 1
fi

# Install into a temporary prefix and rename it into place, so an interrupted run never leaves a
# prefix that the check at the top would take for a finished one.
mkdir -p "$prefix.partial/bin" "$prefix.partial/python"
cp "$src/criu/criu" "$prefix.partial/bin/criu"
cp -r "$src/lib/pycriu" "$prefix.partial/python/pycriu"
find "$prefix.partial/python" \( -name Makefile -o -name '*.o' -o -name '*.d' \) -delete
mv "$prefix.partial" "$prefix"
rm -rf "$build"
echo "$prefix"
