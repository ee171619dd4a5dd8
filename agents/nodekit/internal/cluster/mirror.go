package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"github.com/vishvananda/netns"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/mirror"
)

// The registry mirror: a read-only registry serving the images the cluster loaded
// (package mirror), listening on the fabric bridge's address, which every node's
// namespace reaches on its own link. Each node's containerd sends registry.k8s.io,
// docker.io and every registry a loaded image names to it (certs.d hosts.toml, read on
// every pull), so imagePullPolicy: Always works without the internet, and a name not
// loaded fails at once with the registry's 404 instead of waiting on a registry that
// cannot be reached. It runs in the process that serves the API forwarder (`up` in the
// foreground, else the supervisor), so `down` stops it with that process.
const (
	MirrorIP   = fabricGateway
	MirrorPort = 5000
	// mirrorList is the mirror's list of image tars (one path a line) in the state
	// dir: up writes the images it imports, `nodekit load` appends.
	mirrorList = "mirror/images"
)

// mirrorRegistries are always sent to the mirror: the registries Kubernetes' own images
// and the e2e tests name, beside those of the images loaded. `_default` is every other
// registry for a containerd that reads it (1.7 and later; 1.6 ignores it).
var mirrorRegistries = []string{"_default", "docker.io", "registry.k8s.io", "k8s.gcr.io", "gcr.io", "quay.io", "ghcr.io", "mcr.microsoft.com", "public.ecr.aws"}

// MirrorListFile is the mirror's list of image tars in stateDir.
func MirrorListFile(stateDir string) string { return filepath.Join(stateDir, mirrorList) }

// listenIn opens a TCP listener on addr inside the network namespace at path, from a
// thread that entered it and then ends (the socket keeps the namespace it was made in).
func listenIn(path, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine instead of going back to
		// the pool in the wrong namespace.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err == nil {
			err = netns.Set(h)
			h.Close()
		}
		if err != nil {
			res <- result{err: fmt.Errorf("enter network namespace %s: %w", path, err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		res <- result{l, err}
	}()
	r := <-res
	return r.l, r.err
}

// startMirror opens the mirror's socket in the fabric namespace and lists the tars up
// imports; nothing is served until Serve (or the supervisor) runs.
func (c *Cluster) startMirror(tars []string) error {
	addr := net.JoinHostPort(MirrorIP, strconv.Itoa(MirrorPort))
	l, err := listenIn(nsPath(c.ns("fabric")), addr)
	if err != nil {
		return fmt.Errorf("the registry mirror on %s: %w", addr, err)
	}
	c.MirrorListener = l
	for _, t := range tars {
		if err := mirror.AppendList(MirrorListFile(c.cfg.StateDir), t); err != nil {
			return err
		}
	}
	c.st.Mirror = addr
	return c.st.save()
}

// writeMirrorHosts sends the registries in regs to the mirror in node n's certs.d.
// containerd adds the registry as ns to each request, which is how the mirror tells
// registry.k8s.io/pause from docker.io/library/pause.
func writeMirrorHosts(n Node, mirrorAddr string, regs []string) error {
	// containerd 1.6 refuses a hosts.toml without a host table ("invalid `host` tree")
	// and then falls back to the registry itself: the mirror is both the one host and
	// the server, so a name it does not serve is asked of it twice and never elsewhere.
	hosts := fmt.Sprintf(`# Written by nodekit: pulls from this registry go to the cluster's registry mirror,
# which serves the images the cluster loaded (docs/up.md).
server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, mirrorAddr)
	for _, r := range regs {
		dir := filepath.Join(n.Dir, "certs.d", r)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// registriesOf is mirrorRegistries and the registries the tars' images name.
func registriesOf(tars []string) ([]string, error) {
	out := append([]string(nil), mirrorRegistries...)
	seen := map[string]bool{}
	for _, r := range out {
		seen[r] = true
	}
	for _, t := range tars {
		regs, err := mirror.Registries(t)
		if err != nil {
			return nil, err
		}
		for _, r := range regs {
			if !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// ServeMirror serves the mirror of the cluster in stateDir on l until ctx ends.
func ServeMirror(ctx context.Context, stateDir string, l net.Listener, log io.Writer) error {
	m := mirror.New(mirror.Config{ListFile: MirrorListFile(stateDir), Log: log})
	defer m.Close()
	return m.Serve(ctx, l)
}
