#!/usr/bin/env bash
# Installs stallmon: the release binaries, the systemd unit, the drop-in template for monitored
# services, the journal catalog and the collector's configuration.
#
# Usage: Scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--force] [--dry-run]
#
#   --prefix DIR    installation prefix (default $PREFIX, else /usr/local)
#   --destdir DIR   staging root for packagers (default $DESTDIR, else none: the live system)
#   --no-build      do not run `swift build -c release`; install what is in .build/release
#                   ($SCRATCH_PATH/release when SCRATCH_PATH is set)
#   --force         overwrite an existing /etc/stallmon/stallmond.json
#   --dry-run       print what would be done, change nothing
#
# What goes where ($DESTDIR in front of each):
#   $PREFIX/bin/stallmon, $PREFIX/bin/stallmond          swift build -c release products;
#   $PREFIX/bin/stallmond-daemon                          stallmond runs it from its own directory
#   $PREFIX/lib/systemd/system/stallmond.service         (override: $SYSTEMD_UNIT_DIR) the unit;
#                                                         its /usr/local/bin paths become $PREFIX/bin
#   $PREFIX/share/stallmon/stallmon-monitored.conf       drop-in template for monitored services
#   /usr/lib/systemd/catalog/stallmon.catalog            (override: $CATALOG_DIR) journal catalog
#   /etc/stallmon/stallmond.json                         from config/stallmond.json, mode 0644 (the
#                                                         daemon's dynamic user reads it); an existing
#                                                         file is kept unless --force
# systemd reads units from /usr/local/lib/systemd/system and /usr/lib/systemd/system: with another
# prefix, set SYSTEMD_UNIT_DIR (e.g. /etc/systemd/system).
#
# With no DESTDIR, it then runs `journalctl --update-catalog` and, when systemd is the running init,
# `systemctl daemon-reload`. It never enables or starts anything:
#   systemctl enable --now stallmond.service
#
# Examples:
#   sudo Scripts/install.sh
#   Scripts/install.sh --destdir "$PWD/pkgroot" --prefix /usr     # a package's file tree
set -euo pipefail

readonly ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BUILD=1
FORCE=0
DRY_RUN=0

die() { echo "install.sh: $*" >&2; exit 1; }
usage() { sed -n '5,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 64; }
# Runs a command, or shows it under --dry-run.
run() {
    if ((DRY_RUN)); then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

while (($#)); do
    case $1 in
        --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --destdir) DESTDIR=${2:?--destdir needs a directory}; shift 2 ;;
        --destdir=*) DESTDIR=${1#*=}; shift ;;
        --no-build) BUILD=0; shift ;;
        --force) FORCE=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h | --help) usage ;;
        *) echo "install.sh: unknown argument: $1" >&2; usage ;;
    esac
done
[[ $PREFIX == /* ]] || die "--prefix must be an absolute path: $PREFIX"
[[ -z $DESTDIR || $DESTDIR == /* ]] || DESTDIR=$(pwd)/$DESTDIR
PREFIX=${PREFIX%/}
DESTDIR=${DESTDIR%/}
SYSTEMD_UNIT_DIR=${SYSTEMD_UNIT_DIR:-$PREFIX/lib/systemd/system}
CATALOG_DIR=${CATALOG_DIR:-/usr/lib/systemd/catalog}
SCRATCH_PATH=${SCRATCH_PATH:-$ROOT/.build}
readonly PRODUCTS=(stallmon stallmond stallmond-daemon)

cd "$ROOT"

# Everything we install must exist before anything is installed.
for file in systemd/stallmond.service systemd/stallmon-monitored.conf systemd/stallmon.catalog \
    config/stallmond.json; do
    [[ -f $file ]] || die "$ROOT/$file is missing: nothing was installed"
done

if ((BUILD)); then
    command -v swift >/dev/null || die "swift is not on PATH (or use --no-build with a finished build)"
    for product in "${PRODUCTS[@]}"; do
        run swift build -c release --scratch-path "$SCRATCH_PATH" --product "$product" ||
            die "swift build -c release --product $product failed: nothing was installed"
    done
fi
BIN_DIR=$SCRATCH_PATH/release
if ! ((DRY_RUN && BUILD)); then
    for product in "${PRODUCTS[@]}"; do
        [[ -x $BIN_DIR/$product ]] ||
            die "$BIN_DIR/$product does not exist: build it (swift build -c release --product $product) or drop --no-build"
    done
fi

run install -d -m 0755 "$DESTDIR$PREFIX/bin" "$DESTDIR$SYSTEMD_UNIT_DIR" "$DESTDIR$PREFIX/share/stallmon" \
    "$DESTDIR$CATALOG_DIR" "$DESTDIR/etc/stallmon"
for product in "${PRODUCTS[@]}"; do
    run install -m 0755 "$BIN_DIR/$product" "$DESTDIR$PREFIX/bin/$product"
done

# The unit names its binaries by absolute path. It is rewritten in a private directory of our own,
# never in the target directory, where a name planted beforehand (a link) would be followed; then
# `install` replaces the target as it does every other file.
unit_target=$DESTDIR$SYSTEMD_UNIT_DIR/stallmond.service
if ((DRY_RUN)); then
    echo "+ sed 's|/usr/local/bin/|$PREFIX/bin/|g' systemd/stallmond.service > $unit_target (mode 0644)"
else
    unit_scratch=$(mktemp -d) || die "mktemp -d failed: the unit was not installed"
    trap 'rm -rf "$unit_scratch"' EXIT
    sed "s|/usr/local/bin/|$PREFIX/bin/|g" systemd/stallmond.service >"$unit_scratch/stallmond.service"
    run install -m 0644 "$unit_scratch/stallmond.service" "$unit_target"
fi
run install -m 0644 systemd/stallmon-monitored.conf "$DESTDIR$PREFIX/share/stallmon/stallmon-monitored.conf"
run install -m 0644 systemd/stallmon.catalog "$DESTDIR$CATALOG_DIR/stallmon.catalog"

config_target=$DESTDIR/etc/stallmon/stallmond.json
if [[ -e $config_target ]] && ! ((FORCE)); then
    echo "install.sh: keeping the existing $config_target (--force replaces it)"
else
    run install -m 0644 config/stallmond.json "$config_target"
fi

case $SYSTEMD_UNIT_DIR in
    /usr/local/lib/systemd/system | /usr/lib/systemd/system | /lib/systemd/system | /etc/systemd/system) ;;
    *) echo "install.sh: note: systemd does not look for units in $SYSTEMD_UNIT_DIR (set SYSTEMD_UNIT_DIR)" >&2 ;;
esac

if [[ -z $DESTDIR ]]; then
    if command -v journalctl >/dev/null; then
        run journalctl --update-catalog
    fi
    if [[ -d /run/systemd/system ]]; then
        run systemctl daemon-reload
        echo "install.sh: installed; start the collector with: systemctl enable --now stallmond.service"
    fi
fi
