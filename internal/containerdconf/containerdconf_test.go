package containerdconf_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/containerdconf"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

func TestParseContainerdVersion(t *testing.T) {
	for _, tc := range []struct {
		out    string
		want   containerdconf.Version
		layout int
	}{
		{"containerd github.com/containerd/containerd/v2 v2.4.2 \n", containerdconf.Version{2, 4}, 4},
		{"containerd github.com/containerd/containerd/v2 v2.3.0 abc\n", containerdconf.Version{2, 3}, 4},
		{"containerd github.com/containerd/containerd/v2 v2.1.4 abc\n", containerdconf.Version{2, 1}, 3},
		{"containerd github.com/containerd/containerd/v2 v2.0.0 abc\n", containerdconf.Version{2, 0}, 3},
		{"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", containerdconf.Version{1, 6}, 2},
		{"containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n", containerdconf.Version{1, 7}, 2},
	} {
		v, err := containerdconf.ParseVersion(tc.out)
		require.NoError(t, err, tc.out)
		assert.Equal(t, tc.want, v, tc.out)
		assert.Equal(t, tc.layout, v.ConfigVersion(), tc.out)
	}
	for _, bad := range []string{"", "runc version 1.1.5\n", "containerd x\n", "containerd x vtwo.4\n", "containerd x 2\n"} {
		_, err := containerdconf.ParseVersion(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestRunContainerdVersionNamesTheBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "containerd")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho not a version\n"), 0o755))
	_, err := containerdconf.BinaryVersion(context.Background(), bin)
	require.Error(t, err)
	assert.Contains(t, err.Error(), bin+" --version")

	missing := filepath.Join(t.TempDir(), "containerd")
	_, err = containerdconf.BinaryVersion(context.Background(), missing)
	require.Error(t, err)
	assert.Contains(t, err.Error(), missing+" --version")
}

func testRuntimeConfig(dir string) containerdconf.Config {
	return containerdconf.Config{
		Root:          filepath.Join(dir, "root"),
		State:         filepath.Join(dir, "state"),
		Socket:        filepath.Join(dir, "containerd.sock"),
		Opt:           filepath.Join(dir, "opt"),
		SandboxImage:  "registry.k8s.io/pause:3.10.2",
		StreamAddress: "127.0.0.1",
		Shim:          filepath.Join(dir, "bin", "containerd-shim-runc-v2"),
		RuncRoot:      filepath.Join(dir, "runc"),
		CNIBinDir:     "/usr/lib/cni",
		CNIConfDir:    filepath.Join(dir, "cni"),
		CertsDir:      filepath.Join(dir, "certs.d"),
	}
}

// settings reads the rendered file back as "table.key" -> value. It understands what
// render writes (table headers and key = value lines), nothing more.
func settings(t *testing.T, conf string) map[string]string {
	t.Helper()
	out := map[string]string{}
	table := ""
	for line := range strings.Lines(conf) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			table = strings.Trim(line, "[]")
			continue
		}
		k, v, ok := strings.Cut(line, " = ")
		require.True(t, ok, "line %q", line)
		key := k
		if table != "" {
			key = table + "." + k
		}
		_, dup := out[key]
		require.False(t, dup, "%s set twice", key)
		out[key] = v
	}
	return out
}

// v3Key is where containerd 2's own layouts keep a version 2 setting: the moves
// containerd's migration makes (plugins/cri/{runtime,images}, plugins/cri/cri.go and,
// for version 4, the server plugins).
func v3Key(key string, layout int) string {
	const cri = `plugins."io.containerd.grpc.v1.cri"`
	switch key {
	case "grpc.address":
		if layout >= 4 {
			return `plugins."io.containerd.server.v1.grpc".address`
		}
	case "ttrpc.address":
		if layout >= 4 {
			return `plugins."io.containerd.server.v1.ttrpc".address`
		}
	case cri + ".sandbox_image":
		return `plugins."io.containerd.cri.v1.images".pinned_images.sandbox`
	case cri + ".stream_server_address", cri + ".stream_server_port":
		return key
	case cri + ".containerd.snapshotter":
		return `plugins."io.containerd.cri.v1.images".snapshotter`
	case cri + ".registry.config_path":
		return `plugins."io.containerd.cri.v1.images".registry.config_path`
	case cri + ".cni.bin_dir":
		return `plugins."io.containerd.cri.v1.runtime".cni.bin_dirs`
	}
	if rest, ok := strings.CutPrefix(key, cri+"."); ok {
		return `plugins."io.containerd.cri.v1.runtime".` + rest
	}
	return key
}

func TestRenderContainerdConfig(t *testing.T) {
	rc := testRuntimeConfig("/n")
	cri := `plugins."io.containerd.grpc.v1.cri"`
	v2 := settings(t, rc.Render(containerdconf.Version{1, 6}))
	assert.Equal(t, map[string]string{
		"version":       "2",
		"root":          `"/n/root"`,
		"state":         `"/n/state"`,
		"grpc.address":  `"/n/containerd.sock"`,
		"ttrpc.address": `"/n/containerd.sock.ttrpc"`,
		`plugins."io.containerd.internal.v1.opt".path`:          `"/n/opt"`,
		`plugins."io.containerd.nri.v1.nri".disable`:            "true",
		cri + ".sandbox_image":                                  `"registry.k8s.io/pause:3.10.2"`,
		cri + ".stream_server_address":                          `"127.0.0.1"`,
		cri + ".stream_server_port":                             `"0"`,
		cri + ".disable_apparmor":                               "true",
		cri + ".restrict_oom_score_adj":                         "true",
		cri + ".netns_mounts_under_state_dir":                   "true",
		cri + ".enable_selinux":                                 "false",
		cri + ".containerd.snapshotter":                         `"overlayfs"`,
		cri + ".containerd.default_runtime_name":                `"runc"`,
		cri + ".containerd.runtimes.runc.runtime_type":          `"io.containerd.runc.v2"`,
		cri + ".containerd.runtimes.runc.runtime_path":          `"/n/bin/containerd-shim-runc-v2"`,
		cri + ".containerd.runtimes.runc.options.SystemdCgroup": "false",
		cri + ".containerd.runtimes.runc.options.Root":          `"/n/runc"`,
		cri + ".cni.bin_dir":                                    `"/usr/lib/cni"`,
		cri + ".cni.conf_dir":                                   `"/n/cni"`,
		cri + ".cni.max_conf_num":                               "1",
		cri + ".registry.config_path":                           `"/n/certs.d"`,
	}, v2)

	for _, tc := range []struct {
		v      containerdconf.Version
		layout int
	}{{containerdconf.Version{2, 0}, 3}, {containerdconf.Version{2, 2}, 3}, {containerdconf.Version{2, 4}, 4}} {
		got := settings(t, rc.Render(tc.v))
		// Every setting of the version 2 file, where this layout keeps it.
		want := map[string]string{}
		for k, val := range v2 {
			k2 := v3Key(k, tc.layout)
			if k2 == `plugins."io.containerd.cri.v1.runtime".cni.bin_dirs` {
				if !tc.v.AtLeast(2, 1) {
					k2 = `plugins."io.containerd.cri.v1.runtime".cni.bin_dir`
				} else {
					val = "[" + val + "]"
				}
			}
			want[k2] = val
		}
		want["version"] = strconv.Itoa(tc.layout)
		assert.Equal(t, want, got, "containerd %d.%d", tc.v.Major, tc.v.Minor)
	}

	// Without a shim of its own, containerd finds the one on $PATH.
	rc.Shim = ""
	assert.NotContains(t, rc.Render(containerdconf.Version{1, 6}), "runtime_path")
	assert.NotContains(t, rc.Render(containerdconf.Version{2, 4}), "runtime_path")
}

// TestContainerdConfigDumpsAlike asks containerd 2.x itself: the configuration it
// ends up with (`containerd config dump`, every plugin's settings after migration and
// defaults) is the same from the version 2 file as from the file in its own layout,
// and only the older layouts are migrated.
func TestContainerdConfigDumpsAlike(t *testing.T) {
	bin := filepath.Join(containerd.V2Dir(t), "containerd")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := containerdconf.BinaryVersion(ctx, bin)
	require.NoError(t, err)
	require.GreaterOrEqual(t, v.Major, 2, "%s is not containerd 2.x", bin)

	dir := t.TempDir()
	rc := testRuntimeConfig(dir)
	dump := func(name, conf string) (string, string) {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, "--config", path, "config", "dump")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), stderr.String())
		return stdout.String(), stderr.String()
	}
	old, oldLog := dump("v2.toml", rc.Render(containerdconf.Version{1, 6}))
	own, ownLog := dump("own.toml", rc.Render(v))
	assert.Contains(t, oldLog, "Configuration migrated from version 2")
	assert.NotContains(t, ownLog, "Configuration migrated")
	assert.Equal(t, old, own)
	if v.ConfigVersion() > 3 {
		// The version 3 layout (containerd 2.0 to 2.2) says the same too.
		v3, v3Log := dump("v3.toml", rc.Render(containerdconf.Version{2, 2}))
		assert.Contains(t, v3Log, "Configuration migrated from version 3")
		assert.Equal(t, old, v3)
	}
	assert.Contains(t, own, filepath.Join(dir, "certs.d"))
}
