# Reads modules.dep and prints the paths of the modules named in `want` (space- or
# newline-separated, `-` written `_`) after all of their dependencies: a post-order walk,
# the order insmod needs. Shared by run-in-vm.sh and run-arm64.sh.
#   awk -v want="$MODULES" -v who=run-in-vm -f module-order.awk modules.dep
function base(p, b) { b=p; sub(/.*\//,"",b); sub(/\.ko(\.[a-z]+)?$/,"",b); gsub(/-/,"_",b); return b }
function visit(p, n, i, ds) { if (p in seen) return; seen[p]=1
  n=split(deps[p], ds, " "); for (i=n; i>=1; i--) visit(ds[i]); print p }
{ p=$1; sub(/:$/,"",p); d=""; for (i=2;i<=NF;i++) d=d " " $i; deps[p]=d; path[base(p)]=p }
END { n=split(want, w, /[ \n]+/); for (i=1;i<=n;i++) if (w[i] != "") {
        if (!(w[i] in path)) { print who ": no module " w[i] > "/dev/stderr"; exit 1 }
        visit(path[w[i]]) } }
