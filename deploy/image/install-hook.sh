#!/bin/sh
# Installs libvgpu.so and its contract note into a host directory (the DaemonSet's init container).
#
#   vgpu-dra-install-hook HOST_DIR
#
# The library is bind-mounted into every GPU container and preloaded there, so a half-written or
# wrong file must never appear under its name: the source is checked against its contract note
# (ELF magic, size, sha256), copied to a temporary file in HOST_DIR, checked again, fsynced and
# renamed over the old name (atomic in one directory). Containers already running keep the inode
# they mapped. An identical installed library is left alone. Exit 1 with the reason otherwise.
set -eu

lib=libvgpu.so
note=$lib.contract
dest=${1:?usage: vgpu-dra-install-hook HOST_DIR}
src=${VGPU_DRA_HOOK_SOURCE:-$(cd "$(dirname "$(readlink -f "$0")")/../../.." && pwd)/opt/vgpu-dra/lib}

fail() {
    echo "vgpu-dra-install-hook: $*" >&2
    exit 1
}

field() { # NAME NOTE_FILE
    sed -n "s/^$1 //p" "$2" | head -n 1
}

check() { # LIBRARY NOTE_FILE -> empty output when the library matches the note, else why not
    [ -f "$1" ] || { echo "$1 does not exist"; return; }
    [ "$(od -An -c -N4 "$1" | tr -d ' \n')" = '177ELF' ] || { echo "$1 is not an ELF file"; return; }
    want_size=$(field size "$2")
    size=$(wc -c < "$1" | tr -d ' ')
    [ -n "$want_size" ] && [ "$size" = "$want_size" ] ||
        { echo "$1 is $size bytes, its contract note says ${want_size:-nothing}"; return; }
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    [ "$sum" = "$(field sha256 "$2")" ] || echo "$1 has sha256 $sum, not the one in its contract note"
}

[ -f "$src/$note" ] || fail "no contract note $src/$note"
problem=$(check "$src/$lib" "$src/$note")
[ -z "$problem" ] || fail "refusing to install: $problem"
mkdir -p "$dest"

if [ -f "$dest/$note" ] && [ -z "$(check "$dest/$lib" "$src/$note")" ] &&
    [ "$(field sha256 "$dest/$note")" = "$(field sha256 "$src/$note")" ]; then
    echo "vgpu-dra-install-hook: $dest/$lib is up to date ($(field sha256 "$src/$note"))"
    exit 0
fi

tmp_lib=$(mktemp "$dest/.$lib.XXXXXX")
tmp_note=$(mktemp "$dest/.$note.XXXXXX")
trap 'rm -f "$tmp_lib" "$tmp_note"' EXIT
cat "$src/$lib" > "$tmp_lib"
cat "$src/$note" > "$tmp_note"
chmod 0644 "$tmp_lib" "$tmp_note"
problem=$(check "$tmp_lib" "$src/$note")
[ -z "$problem" ] || fail "copy into $dest is damaged: $problem"
sync "$tmp_lib" "$tmp_note"
# Library first: a note never describes a library that is not there yet.
mv -f "$tmp_lib" "$dest/$lib"
mv -f "$tmp_note" "$dest/$note"
sync "$dest"
trap - EXIT
echo "vgpu-dra-install-hook: installed $dest/$lib ($(field sha256 "$src/$note"))"
