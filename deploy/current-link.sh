# Sourced by deploy/fill-data.sh and deploy/copy-data.sh (POSIX sh).
#
# point_current VERSION WHO: $link (<root>/current) names VERSION, swapped by one rename, so a node
# reading the link sees the old version or the new one, never none; WHO prefixes the line it prints.
point_current() {
  ln -sfn "$1" "$root/.$(basename "$link").partial"
  mv -T "$root/.$(basename "$link").partial" "$link"
  echo "$2: $link -> $1"
}
