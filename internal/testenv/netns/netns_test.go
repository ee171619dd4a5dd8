package netns_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// TestEnv is the harness self-test: the client reaches every pod over HTTP and UDP,
// pods reach each other, a command runs in the node namespace, a DNAT rule in the
// node namespace steers ClusterIP traffic, and after teardown nothing is left: no
// goroutine, no file descriptor, no reference to any namespace the harness made, and
// the test's own namespace never changed.
func TestEnv(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	rootBefore := threadNetNS(t)
	fdsBefore := openFDs(t)
	ignore := goleak.IgnoreCurrent()

	var inodes []uint64
	t.Run("traffic", func(t *testing.T) {
		env := netns.New(t, netns.Config{Pods: 3})
		for _, n := range env.Namespaces() {
			ino, err := n.Inode()
			require.NoError(t, err)
			require.NotEqual(t, rootBefore, ino, "%s must not be the test's own namespace", n.Name)
			inodes = append(inodes, ino)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client := env.Client.HTTPClient(0)
		defer client.CloseIdleConnections()

		t.Run("client reaches every pod over HTTP and UDP", func(t *testing.T) {
			for _, p := range env.Pods {
				name, remote, err := netns.Get(ctx, client, p.HTTPAddr())
				require.NoError(t, err, "GET %s", p.HTTPAddr())
				assert.Equal(t, p.Name, name)
				host, _, _ := net.SplitHostPort(remote)
				assert.Equal(t, env.ClientIP.String(), host, "routed, not NATed: the pod sees the client")

				name, err = netns.EchoUDP(ctx, env.Client, p.UDPAddr(), "ping", 0)
				require.NoError(t, err, "UDP echo %s", p.UDPAddr())
				assert.Equal(t, p.Name, name)
				assert.EqualValues(t, 1, p.HTTPRequests())
				assert.EqualValues(t, 1, p.UDPPackets())
			}
		})

		t.Run("pods reach each other across the bridge", func(t *testing.T) {
			c := env.Pods[0].HTTPClient(0)
			defer c.CloseIdleConnections()
			name, remote, err := netns.Get(ctx, c, env.Pods[1].HTTPAddr())
			require.NoError(t, err)
			assert.Equal(t, env.Pods[1].Name, name)
			assert.True(t, strings.HasPrefix(remote, env.Pods[0].IP.String()+":"), "remote %s", remote)
		})

		t.Run("node is set up as a host", func(t *testing.T) {
			out, err := env.NodeRun(ctx, "", testenv.LookPath(t, "ip"), "-o", "link", "show", "master", netns.BridgeName)
			require.NoError(t, err)
			assert.Equal(t, len(env.Pods), strings.Count(out, "veth-pod-"), out)

			out, err = env.NodeRun(ctx, "", "ip", "-o", "route", "show", env.ServiceCIDR.String())
			require.NoError(t, err)
			assert.Contains(t, out, "dev "+netns.BridgeName)

			out, err = env.NodeRun(ctx, "", "sh", "-c",
				"cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/all/send_redirects /proc/sys/net/ipv4/conf/"+netns.BridgeName+"/send_redirects")
			require.NoError(t, err)
			assert.Equal(t, "1\n0\n0\n", out)

			for _, p := range env.Pods {
				idx := strings.TrimPrefix(p.Name, "pod-")
				l, err := env.Node.Netlink().LinkByName("veth-pod-" + idx)
				require.NoError(t, err)
				pi, err := env.Node.Netlink().LinkGetProtinfo(l)
				require.NoError(t, err)
				assert.True(t, pi.Hairpin, "hairpin on %s", l.Attrs().Name)
			}
		})

		t.Run("nothing of it is visible in the test's own namespace", func(t *testing.T) {
			_, err := netlink.LinkByName(netns.BridgeName)
			assert.Error(t, err, "the bridge must exist only in the node namespace")
			assert.Equal(t, rootBefore, threadNetNS(t))
		})

		t.Run("a DNAT rule in the node steers ClusterIP traffic", func(t *testing.T) {
			nft := testenv.LookPath(t, "nft")
			vip := "10.96.0.10"
			ruleset := fmt.Sprintf(`table ip nk-selftest {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s tcp dport 80 dnat to %s; ip daddr %s udp dport 53 dnat to %s; }
}`, vip, env.Pods[2].HTTPAddr(), vip, env.Pods[2].UDPAddr())
			_, err := env.NodeRun(ctx, ruleset, nft, "-f", "-")
			require.NoError(t, err)
			name, _, err := netns.Get(ctx, client, vip+":80")
			require.NoError(t, err)
			assert.Equal(t, env.Pods[2].Name, name)
			name, err = netns.EchoUDP(ctx, env.Client, vip+":53", "dns?", 0)
			require.NoError(t, err)
			assert.Equal(t, env.Pods[2].Name, name)
			// A pod reaching itself through the VIP needs hairpin; masquerade makes the reply
			// come back through the node.
			_, err = env.NodeRun(ctx, fmt.Sprintf(`table ip nk-selftest {
	chain post { type nat hook postrouting priority srcnat; ip saddr %s ip daddr %s masquerade; }
}`, env.Pods[2].IP, env.Pods[2].IP), nft, "-f", "-")
			require.NoError(t, err)
			self := env.Pods[2].HTTPClient(0)
			defer self.CloseIdleConnections()
			name, remote, err := netns.Get(ctx, self, vip+":80")
			require.NoError(t, err)
			assert.Equal(t, env.Pods[2].Name, name)
			assert.True(t, strings.HasPrefix(remote, env.GatewayIP.String()+":"), "hairpin traffic is masqueraded to the bridge address, got %s", remote)
		})
	})

	t.Run("teardown leaves nothing", func(t *testing.T) {
		if len(inodes) == 0 {
			t.Skip("the environment was not built")
		}
		goleak.VerifyNone(t, ignore)
		assert.Equal(t, fdsBefore, openFDs(t), "open file descriptors")
		refs := nsReferences(t)
		for _, ino := range inodes {
			assert.NotContains(t, refs, ino, "namespace inode %d is still referenced", ino)
		}
		assert.Equal(t, rootBefore, threadNetNS(t))
	})
}

// TestTwoEnvs checks that environments are isolated: two with identical addresses
// coexist, each answering with its own pods.
func TestTwoEnvs(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	a := netns.New(t, netns.Config{Pods: 1})
	b := netns.New(t, netns.Config{Pods: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, env := range []*netns.Env{a, b} {
		_, _, err := netns.Get(ctx, env.Client.HTTPClient(0), env.Pods[0].HTTPAddr())
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, a.Pods[0].HTTPRequests())
	assert.EqualValues(t, 1, b.Pods[0].HTTPRequests())
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  netns.Config
	}{
		{"too many pods", netns.Config{Pods: 201}},
		{"negative pods", netns.Config{Pods: -1}},
		{"pod CIDR not a /24", netns.Config{PodCIDR: "10.244.0.0/16"}},
		{"external CIDR not IPv4", netns.Config{ExternalCIDR: "fd00::/120"}},
		{"bad service CIDR", netns.Config{ServiceCIDR: "10.96.0.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fatalRecorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				netns.New(ft, tc.cfg)
			}()
			<-done
			if os.Geteuid() != 0 {
				t.Skip("New checks root before the configuration")
			}
			assert.True(t, ft.failed, "New must reject %+v", tc.cfg)
		})
	}
}

// fatalRecorder records Fatal instead of failing the real test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Fatal(args ...any) { f.failed = true; runtime.Goexit() }
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	runtime.Goexit()
}
func (f *fatalRecorder) Skip(args ...any)                  { runtime.Goexit() }
func (f *fatalRecorder) Skipf(format string, args ...any)  { runtime.Goexit() }
func (f *fatalRecorder) Cleanup(fn func())                 { fn() }
func (f *fatalRecorder) Logf(format string, args ...any)   {}
func (f *fatalRecorder) Errorf(format string, args ...any) { f.failed = true }

// threadNetNS returns the inode of the network namespace of a fresh locked thread.
func threadNetNS(t *testing.T) uint64 {
	t.Helper()
	ch := make(chan uint64)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			ch <- 0
			return
		}
		ch <- st.Ino
	}()
	ino := <-ch
	require.NotZero(t, ino)
	return ino
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// nsReferences returns the inodes of every namespace an fd or a thread of this
// process refers to.
func nsReferences(t *testing.T) map[uint64]bool {
	t.Helper()
	refs := map[uint64]bool{}
	paths, _ := filepath.Glob("/proc/self/fd/*")
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for _, p := range append(paths, tasks...) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil {
			refs[st.Ino] = true
		}
	}
	return refs
}
