// Package containerdconf writes a containerd configuration file in the layout the
// containerd that reads it expects: version 2 for containerd 1.x, 3 for 2.0 to 2.2
// and 4 from 2.3, with the same settings in each, so a containerd 2.x does not
// migrate its configuration at every start. `nodekit up` writes its nodes' files
// with it, and the test harness its containerds'.
package containerdconf

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Config is what a containerd configuration says, whatever its layout.
type Config struct {
	Root, State string
	// Socket is the gRPC socket's path; the ttrpc socket is Socket+".ttrpc".
	Socket string
	// Opt is the opt plugin's folder (it would otherwise write to /opt/containerd).
	Opt           string
	SandboxImage  string
	StreamAddress string
	// Shim is the runc shim's path, empty for the one on $PATH.
	Shim       string
	RuncRoot   string
	CNIBinDir  string
	CNIConfDir string
	// CertsDir is the registry config_path (certs.d/REGISTRY/hosts.toml).
	CertsDir string
}

// Version is the major and minor version of a containerd binary.
type Version struct{ Major, Minor int }

// AtLeast tells whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// ConfigVersion is the newest configuration layout v reads as written: 2 (containerd
// 1.3 and later), 3 (2.0: the CRI plugin split into cri.v1.runtime and cri.v1.images,
// the grpc.v1.cri plugin keeping the streaming server) or 4 (2.3: the socket
// addresses moved from [grpc] and [ttrpc] into the server plugins). containerd
// migrates an older layout in memory at every start and logs a warning.
func (v Version) ConfigVersion() int {
	switch {
	case v.AtLeast(2, 3):
		return 4
	case v.AtLeast(2, 0):
		return 3
	default:
		return 2
	}
}

// ParseVersion reads the version out of `containerd --version`:
// "containerd github.com/containerd/containerd/v2 v2.4.2 <commit>", or Debian's
// "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3".
func ParseVersion(out string) (Version, error) {
	f := strings.Fields(out)
	if len(f) < 3 || f[0] != "containerd" {
		return Version{}, fmt.Errorf("unexpected version output %q", strings.TrimSpace(out))
	}
	parts := strings.SplitN(strings.TrimPrefix(f[2], "v"), ".", 3)
	var v Version
	var errMajor, errMinor error
	if len(parts) >= 2 {
		v.Major, errMajor = strconv.Atoi(parts[0])
		v.Minor, errMinor = strconv.Atoi(parts[1])
	}
	if len(parts) < 2 || errMajor != nil || errMinor != nil {
		return Version{}, fmt.Errorf("unexpected version %q in %q", f[2], strings.TrimSpace(out))
	}
	return v, nil
}

// BinaryVersion runs `bin --version` and parses what it prints.
func BinaryVersion(ctx context.Context, bin string) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return Version{}, fmt.Errorf("%s --version: %w", bin, err)
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return Version{}, fmt.Errorf("%s --version: %w", bin, err)
	}
	return v, nil
}

// Render writes the configuration for a containerd of version v, in the newest layout
// it reads. Every layout holds the same settings: containerd 2.x reading the version
// 2 file migrates it to what the version 3 and 4 files say.
func (rc Config) Render(v Version) string {
	version := v.ConfigVersion()
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, "version = %d\nroot = %s\nstate = %s\n", version, q(rc.Root), q(rc.State))
	if version < 4 {
		fmt.Fprintf(&b, "[grpc]\n  address = %s\n[ttrpc]\n  address = %s\n", q(rc.Socket), q(rc.Socket+".ttrpc"))
	}
	b.WriteString("[plugins]\n")
	if version >= 4 {
		fmt.Fprintf(&b, "  [plugins.\"io.containerd.server.v1.grpc\"]\n    address = %s\n", q(rc.Socket))
		fmt.Fprintf(&b, "  [plugins.\"io.containerd.server.v1.ttrpc\"]\n    address = %s\n", q(rc.Socket+".ttrpc"))
	}
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.internal.v1.opt\"]\n    path = %s\n", q(rc.Opt))
	// NRI is off: containerd 2.x turns it on with one socket for the whole machine
	// (/var/run/nri/nri.sock), which every node's containerd would fight over, and
	// nothing here uses it. containerd 1.6 has no such plugin and ignores the table.
	b.WriteString("  [plugins.\"io.containerd.nri.v1.nri\"]\n    disable = true\n")
	// Version 2 keeps every CRI setting in the one grpc.v1.cri plugin; from version 3
	// it keeps the streaming server only, the image settings (snapshotter, pinned
	// sandbox image, registry) are cri.v1.images' and the rest cri.v1.runtime's.
	runtime := `plugins."io.containerd.grpc.v1.cri"`
	if version >= 3 {
		const images, server = `plugins."io.containerd.cri.v1.images"`, `plugins."io.containerd.grpc.v1.cri"`
		runtime = `plugins."io.containerd.cri.v1.runtime"`
		fmt.Fprintf(&b, "  [%s]\n    stream_server_address = %s\n    stream_server_port = \"0\"\n", server, q(rc.StreamAddress))
		fmt.Fprintf(&b, "  [%s]\n    snapshotter = \"overlayfs\"\n", images)
		fmt.Fprintf(&b, "  [%s.pinned_images]\n    sandbox = %s\n", images, q(rc.SandboxImage))
		fmt.Fprintf(&b, "  [%s.registry]\n    config_path = %s\n", images, q(rc.CertsDir))
		fmt.Fprintf(&b, "  [%s]\n", runtime)
	} else {
		fmt.Fprintf(&b, "  [%s]\n    sandbox_image = %s\n", runtime, q(rc.SandboxImage))
		fmt.Fprintf(&b, "    stream_server_address = %s\n    stream_server_port = \"0\"\n", q(rc.StreamAddress))
	}
	b.WriteString("    disable_apparmor = true\n    restrict_oom_score_adj = true\n")
	b.WriteString("    netns_mounts_under_state_dir = true\n    enable_selinux = false\n")
	fmt.Fprintf(&b, "  [%s.containerd]\n", runtime)
	if version < 3 {
		b.WriteString("    snapshotter = \"overlayfs\"\n")
	}
	b.WriteString("    default_runtime_name = \"runc\"\n")
	fmt.Fprintf(&b, "  [%s.containerd.runtimes.runc]\n    runtime_type = \"io.containerd.runc.v2\"\n", runtime)
	// containerd looks for the shim on $PATH first: a containerd of its own gets its
	// own shim by path.
	if rc.Shim != "" {
		fmt.Fprintf(&b, "    runtime_path = %s\n", q(rc.Shim))
	}
	fmt.Fprintf(&b, "  [%s.containerd.runtimes.runc.options]\n    SystemdCgroup = false\n    Root = %s\n", runtime, q(rc.RuncRoot))
	fmt.Fprintf(&b, "  [%s.cni]\n", runtime)
	if v.AtLeast(2, 1) {
		// bin_dirs came in 2.1; 2.4 reads only it in a version 3 or 4 file.
		fmt.Fprintf(&b, "    bin_dirs = [%s]\n", q(rc.CNIBinDir))
	} else {
		fmt.Fprintf(&b, "    bin_dir = %s\n", q(rc.CNIBinDir))
	}
	fmt.Fprintf(&b, "    conf_dir = %s\n    max_conf_num = 1\n", q(rc.CNIConfDir))
	if version < 3 {
		fmt.Fprintf(&b, "  [%s.registry]\n    config_path = %s\n", runtime, q(rc.CertsDir))
	}
	return b.String()
}
