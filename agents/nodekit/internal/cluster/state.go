package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// State is what `up` made, written to STATE_DIR/state.json after every step, so that
// `down` removes exactly that and nothing else, even after a crash half-way.
type State struct {
	Name     string `json:"name"`
	StateDir string `json:"stateDir"`
	// APIPort is the port on the machine's 127.0.0.1 the forwarder listens on (with
	// HostNetwork, the API server itself).
	APIPort int `json:"apiPort"`
	// ControlPlaneIP is the API server's address on the fabric (with HostNetwork, the
	// node's address on the machine's network).
	ControlPlaneIP string `json:"controlPlaneIP"`
	// HostNetwork: the node and the control plane run in the machine's own network
	// namespace (`up --host-network`); no namespace and no forwarder are made.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// Host is what the host-network node changes on the machine outside the state dir,
	// recorded before it is made; down undoes it.
	Host *HostChanges `json:"host,omitempty"`
	// Mirror is the registry mirror's address on the fabric ("172.30.0.1:5000"), where
	// every node's containerd pulls from; "" when there is none (HostNetwork).
	Mirror string `json:"mirror,omitempty"`
	// ContainerdDir holds the containerd binaries the nodes run (Config.ContainerdDir);
	// "" is the machine's own on $PATH.
	ContainerdDir string `json:"containerdDir,omitempty"`
	// GracePeriod is kube-controller-manager's --node-monitor-grace-period.
	GracePeriod string `json:"nodeMonitorGracePeriod"`
	// Namespaces are the network namespaces made (names under /var/run/netns), in order.
	Namespaces []string `json:"namespaces"`
	// Processes are every long-running process started, in start order.
	Processes []Process `json:"processes"`
	Nodes     []Node    `json:"nodes"`
}

// Process is one started process, identified by PID and start time so that a PID
// reused by the system is never signalled.
type Process struct {
	Name      string `json:"name"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	// Node is the node it serves, "" for the control plane and the supervisor.
	Node string `json:"node,omitempty"`
	Log  string `json:"log,omitempty"`
	// Command is the full command line it was started with (nsenter included), so
	// `nodekit restart` starts it again exactly so.
	Command []string `json:"command,omitempty"`
}

// Node is one node namespace.
type Node struct {
	Name    string `json:"name"`
	IP      string `json:"ip"`
	PodCIDR string `json:"podCIDR"`
	// NetNS is the node's network namespace; "" is the machine's own (--host-network).
	NetNS     string `json:"netns"`
	Dir       string `json:"dir"`
	Runtime   string `json:"runtimeEndpoint"`
	CNIConfig string `json:"cniConfDir"`
	// CgroupRoot is the kubelet's cgroupRoot, made by up and removed by down.
	CgroupRoot string `json:"cgroupRoot,omitempty"`
}

// StateFile is the state file's name in the state dir.
const StateFile = "state.json"

// ErrInUse marks a state dir that already holds a cluster.
var ErrInUse = errors.New("state dir in use")

// ErrNameInUse marks a cluster name whose network namespaces exist.
var ErrNameInUse = errors.New("cluster name in use")

// ErrPortInUse marks an API port something else listens on.
var ErrPortInUse = errors.New("port in use")

// ErrNoCluster marks a state dir without a cluster.
var ErrNoCluster = errors.New("no cluster")

// LoadState reads dir's state file.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (no %s)", ErrNoCluster, dir, StateFile)
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &st, nil
}

func (st *State) save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(st.StateDir, StateFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// claim creates the state file exclusively: the one atomic step that makes a second
// `up` on the same state dir fail before it touches anything.
func claim(dir, name string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, StateFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return inUse(dir)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "{\"name\": %q, \"stateDir\": %q}\n", name, dir)
	return errors.Join(err, f.Close())
}

// checkFree fails when dir already holds a cluster's state file.
func checkFree(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		return inUse(dir)
	}
	return nil
}

func inUse(dir string) error {
	{
		msg := "a cluster was started here"
		if st, lerr := LoadState(dir); lerr == nil {
			alive := 0
			for _, p := range st.Processes {
				if p.Alive() {
					alive++
				}
			}
			msg = fmt.Sprintf("cluster %q is there with %d of %d processes running", st.Name, alive, len(st.Processes))
		}
		return fmt.Errorf("%w: %s: %s; run `nodekit down --state-dir %s` first", ErrInUse, dir, msg, dir)
	}
}

// startTime is field 22 of /proc/PID/stat (clock ticks since boot).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command name (field 2) may hold spaces; fields are counted after its ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unparsable /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the recorded process still runs (same PID, same start time,
// not a zombie).
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	st, err := startTime(p.PID)
	if err != nil || st != p.StartTime {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	if err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z") {
			return false
		}
	}
	return syscall.Kill(p.PID, 0) == nil
}
