package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrPortTaken marks a start-up that lost a port to another process: its peer could
// not bind (the port was free when FreePorts chose it), or the server answering on
// the port is not the peer the harness started. Harnesses start again on fresh ports.
var ErrPortTaken = errors.New("port taken by another process")

// Ports are handed out from a range below Linux's default ephemeral range
// (32768-60999), so the kernel never gives one of them to an outgoing connection or
// to a bind to port 0, in this process or any other. The range is cut into blocks; a
// test process takes a block with an exclusive flock on a file under portLockDir and
// hands its ports out one after the other, so nodekit test processes running side by
// side never choose the same port. The flock is held until the process exits (one fd
// per block taken, usually one): a port handed out stays reserved while the peer that
// uses it runs.
const (
	portRangeLow  = 20000
	portRangeHigh = 32000 // exclusive
	portBlockSize = 100
	portLockDir   = "/run/lock"
)

var portBlocks struct {
	mu    sync.Mutex
	locks []*os.File
	// next is the next port to try in the current block; end is the block's end.
	next, end int
}

// FreePorts returns n distinct TCP ports that are free on 127.0.0.1 now and that no
// other nodekit test process will choose (see the block reservation above). A process
// that is not a nodekit test may still bind one before the caller's peer does:
// harnesses check that the peer listening on each port is theirs (Process.CheckListening)
// and start again on fresh ports when it is not (ErrPortTaken).
//
// When no block can be reserved (the lock folder is not writable, or every block is
// taken), the ports are the kernel's choice, free only a moment ago.
func FreePorts(n int) ([]int, error) {
	portBlocks.mu.Lock()
	defer portBlocks.mu.Unlock()
	ports := make([]int, 0, n)
	for len(ports) < n {
		if portBlocks.next >= portBlocks.end {
			if err := reservePortBlock(); err != nil {
				rest, kerr := kernelPorts(n - len(ports))
				if kerr != nil {
					return nil, fmt.Errorf("reserve a port: %w (and no port block: %v)", kerr, err)
				}
				return append(ports, rest...), nil
			}
		}
		port := portBlocks.next
		portBlocks.next++
		// Something that is not a nodekit test may listen there (a leftover peer, a
		// service): skip the port rather than hand it out.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		ports = append(ports, port)
	}
	return ports, nil
}

// reservePortBlock takes the next block nobody holds, starting at a random one.
// Called with portBlocks.mu held.
func reservePortBlock() error {
	blocks := (portRangeHigh - portRangeLow) / portBlockSize
	first := rand.IntN(blocks)
	var lastErr error
	for i := range blocks {
		b := (first + i) % blocks
		f, err := os.OpenFile(filepath.Join(portLockDir, fmt.Sprintf("nodekit-ports-%d.lock", b)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			lastErr = err
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			lastErr = err
			continue
		}
		portBlocks.locks = append(portBlocks.locks, f)
		portBlocks.next = portRangeLow + b*portBlockSize
		portBlocks.end = portBlocks.next + portBlockSize
		return nil
	}
	return fmt.Errorf("no free block of %d ports in %d-%d: %w", portBlockSize, portRangeLow, portRangeHigh-1, lastErr)
}

// kernelPorts is the fallback: ports the kernel picks for a bind to port 0.
func kernelPorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// CheckListening tells whether the process itself listens on each TCP port. It
// returns nil when it does, an error wrapping ErrPortTaken when another process's
// socket listens on one of them (whatever answers there is not this peer), and
// another error when nothing listens on a port yet.
//
// The answer is certain, not a guess from what the server says: the listening
// sockets of the process's network namespace (/proc/PID/net/tcp and tcp6) are
// matched by inode against the process's own file descriptors (/proc/PID/fd), which
// a process may read for its children.
func (p *Process) CheckListening(ports ...int) error {
	return checkListening(p.Cmd.Process.Pid, p.done, ports...)
}

func checkListening(pid int, exited <-chan struct{}, ports ...int) error {
	if exitedNow(exited) {
		return errors.New("the process has exited")
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	listeners := map[int][]string{}
	for _, table := range []string{"tcp", "tcp6"} {
		if err := listeningInodes(filepath.Join(proc, "net", table), listeners); err != nil {
			return err
		}
	}
	fds, err := os.ReadDir(filepath.Join(proc, "fd"))
	if err != nil {
		return fmt.Errorf("list the process's file descriptors: %w", err)
	}
	own := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(proc, "fd", fd.Name()))
		if err != nil {
			continue // closed since the listing
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			own[strings.TrimSuffix(inode, "]")] = true
		}
	}
	// The pid is only ours while the process has not been reaped.
	if exitedNow(exited) {
		return errors.New("the process has exited")
	}
	for _, port := range ports {
		inodes := listeners[port]
		if len(inodes) == 0 {
			return fmt.Errorf("nothing listens on port %d yet", port)
		}
		mine := false
		for _, inode := range inodes {
			mine = mine || own[inode]
		}
		if !mine {
			return fmt.Errorf("%w: port %d is held by a socket of another process (inode %s), not pid %d's", ErrPortTaken, port, strings.Join(inodes, ","), pid)
		}
	}
	return nil
}

func exitedNow(exited <-chan struct{}) bool {
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// listeningInodes adds the inode of every LISTEN socket in a /proc/net/tcp-style
// table to listeners, by local port.
func listeningInodes(path string, listeners map[int][]string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(path, "6") {
			return nil // no IPv6 in this kernel
		}
		return fmt.Errorf("read listening sockets: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // 0A is TCP_LISTEN
			continue
		}
		_, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			continue
		}
		listeners[int(port)] = append(listeners[int(port)], fields[9])
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}
