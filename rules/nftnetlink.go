package rules

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// Kernel constants golang.org/x/sys/unix does not carry.
const (
	nftaTableUserdata = 6  // NFTA_TABLE_USERDATA
	nftaChainUserdata = 12 // NFTA_CHAIN_USERDATA
	nfDrop            = 0  // NF_DROP
	nfAccept          = 1  // NF_ACCEPT
)

// nftElementsPerMessage caps the elements of one NEWSETELEM/DELSETELEM message; a
// big map is written as several messages of the same batch.
const nftElementsPerMessage = 1000

// nftReplyTimeout bounds the wait for the kernel's answer when ctx has no deadline.
// The kernel processes a batch while the send call runs, so the answer is already
// queued when the wait starts.
const nftReplyTimeout = 30 * time.Second

// netlinkApplier sends a transaction to nf_tables as one nfnetlink batch, the way
// nft does: a BATCH_BEGIN message, one message per command (set elements grouped),
// BATCH_END. The kernel applies the batch as one transaction or refuses all of it.
//
// The socket is opened per apply, in the network namespace of the calling thread.
type netlinkApplier struct {
	family Family
	table  string
	// keys remembers each set's and map's key and data types, learnt from the
	// transactions that created them, so partial syncs can encode elements
	// without asking the kernel.
	keys map[string]*nftSetType
	// exprs caches the encoding of constant statements (see exprEncoder).
	exprs map[string][]byte
	seq   uint32
}

func newNetlinkApplier(family Family, table string) *netlinkApplier {
	return &netlinkApplier{family: family, table: table, keys: map[string]*nftSetType{}, exprs: map[string][]byte{}, seq: uint32(time.Now().Unix())}
}

// nftSetType is a set's key (and, for a map, data) layout.
type nftSetType struct {
	key    []nftDatatype
	isMap  bool
	keyLen uint32
}

// nftDatatype is one of the few nft datatypes this package's sets use.
type nftDatatype struct {
	name string
	id   uint32 // nft's datatype number
	size int    // bytes
}

var nftDatatypes = map[string]nftDatatype{
	"ipv4_addr":    {"ipv4_addr", 7, 4},
	"ipv6_addr":    {"ipv6_addr", 8, 16},
	"inet_proto":   {"inet_proto", 12, 1},
	"inet_service": {"inet_service", 13, 2},
}

// parseSetType reads "a . b . c" or "a . b : verdict".
func parseSetType(spec string, isMap bool) (*nftSetType, error) {
	keySpec := spec
	if isMap {
		k, data, ok := strings.Cut(spec, " : ")
		if !ok || data != "verdict" {
			return nil, fmt.Errorf("map type %q: only verdict maps are supported", spec)
		}
		keySpec = k
	}
	t := &nftSetType{isMap: isMap}
	for _, name := range strings.Split(keySpec, " . ") {
		dt, ok := nftDatatypes[name]
		if !ok {
			return nil, fmt.Errorf("set type %q: unknown datatype %q", spec, name)
		}
		t.key = append(t.key, dt)
	}
	if len(t.key) == 1 {
		t.keyLen = uint32(t.key[0].size)
	} else {
		for _, dt := range t.key {
			t.keyLen += uint32((dt.size + 3) / 4 * 4)
		}
	}
	return t, nil
}

// typeID is NFTA_SET_KEY_TYPE: a concatenation packs its datatypes six bits each.
func (t *nftSetType) typeID() uint32 {
	var id uint32
	for _, dt := range t.key {
		id = id<<6 | dt.id
	}
	return id
}

// encodeKey turns an element key into the kernel's bytes: each field of a
// concatenation padded to four bytes.
func (t *nftSetType) encodeKey(key []string) ([]byte, error) {
	if len(key) != len(t.key) {
		return nil, fmt.Errorf("key %q has %d fields, the set's type %d", key, len(key), len(t.key))
	}
	out := make([]byte, 0, t.keyLen)
	for i, dt := range t.key {
		var field []byte
		switch dt.name {
		case "ipv4_addr", "ipv6_addr":
			f := IPv4
			if dt.name == "ipv6_addr" {
				f = IPv6
			}
			a, err := netip.ParseAddr(key[i])
			if err != nil || !f.has(a) {
				return nil, fmt.Errorf("key field %q is not an %s address", key[i], f)
			}
			if f == IPv4 {
				b := a.As4()
				field = b[:]
			} else {
				b := a.As16()
				field = b[:]
			}
		case "inet_proto":
			p, ok := protoNumbers[key[i]]
			if !ok {
				return nil, fmt.Errorf("key field %q is not a protocol", key[i])
			}
			field = []byte{p}
		case "inet_service":
			n, err := strconv.ParseUint(key[i], 10, 16)
			if err != nil {
				return nil, fmt.Errorf("key field %q is not a port", key[i])
			}
			field = binary.BigEndian.AppendUint16(nil, uint16(n))
		}
		out = append(out, field...)
		if len(t.key) > 1 {
			for len(out)%4 != 0 {
				out = append(out, 0)
			}
		}
	}
	return out, nil
}

// Userdata TLVs nft attaches to sets, so `nft list` prints them as it does its own.
var (
	// typeof of a concatenation: expression "concat" with no typeof fields, as nft
	// 1.0.6 writes it for `type a . b` sets.
	udConcatTypeof = []byte{0, 4, 13, 0, 0, 0, 1, 0}
)

func (t *nftSetType) userdata(comment *string) ([]byte, error) {
	var ud []byte
	u32 := func(typ byte, v uint32) { ud = append(append(ud, typ, 4), hostU32(v)...) }
	if len(t.key) == 1 {
		u32(0, 2) // key byte order: big endian
	} else {
		u32(0, 0) // key byte order of a concatenation: none
	}
	if t.isMap {
		u32(1, 0) // data byte order of a verdict: none
	}
	if len(t.key) > 1 {
		ud = append(append(ud, 3, byte(len(udConcatTypeof))), udConcatTypeof...)
	}
	if t.isMap {
		u32(6, 0) // data is not an interval
	}
	if comment != nil {
		c, err := udString(*comment)
		if err != nil {
			return nil, err
		}
		ud = append(append(ud, 7, byte(len(c))), c...)
	}
	return ud, nil
}

// udString is a NUL-terminated userdata string; a TLV length is one byte.
func udString(s string) ([]byte, error) {
	if len(s)+1 > math.MaxUint8 || strings.IndexByte(s, 0) >= 0 {
		return nil, fmt.Errorf("comment %q too long or not text", s)
	}
	return append([]byte(s), 0), nil
}

// udComment is the one-TLV userdata of a table, chain, rule or element comment.
func udComment(s string) ([]byte, error) {
	c, err := udString(s)
	if err != nil {
		return nil, err
	}
	return append([]byte{0, byte(len(c))}, c...), nil
}

// nlBatch builds the bytes of one nfnetlink batch, attributes written in place.
type nlBatch struct {
	buf []byte
	seq uint32
	// first is the sequence number of BATCH_BEGIN; cmds[i] is the command sent
	// with sequence number first+1+i, for naming the command at fault.
	first uint32
	cmds  []batchCmd
	// nests holds the offsets of the open nested attributes.
	nests []int
	err   error
	setID uint32
	// nfproto is the family byte of every nf_tables message.
	nfproto uint8
}

// batchCmd is the transaction command (or run of element commands) of a message.
type batchCmd struct{ op, n int }

// begin starts a message of the nf_tables subsystem for command op (n commands).
func (b *nlBatch) begin(typ, flags uint16, op, n int) {
	b.seq++
	b.cmds = append(b.cmds, batchCmd{op, n})
	b.header(uint16(unix.NFNL_SUBSYS_NFTABLES)<<8|typ, flags, b.nfproto, 0)
}

// header starts a message: nlmsghdr (length patched by end) and nfgenmsg.
func (b *nlBatch) header(typ, flags uint16, family uint8, resID uint16) {
	b.nests = append(b.nests[:0], len(b.buf))
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, unix.NLM_F_REQUEST|flags)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, b.seq)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0)
	b.buf = append(b.buf, family, unix.NFNETLINK_V0)
	b.buf = binary.BigEndian.AppendUint16(b.buf, resID)
}

// end closes the message begun last.
func (b *nlBatch) end() {
	start := b.nests[0]
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
	b.nests = b.nests[:0]
}

func appendAttr(buf []byte, typ uint16, data []byte) []byte {
	buf = binary.NativeEndian.AppendUint16(buf, uint16(4+len(data)))
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = append(buf, data...)
	for len(buf)%4 != 0 {
		buf = append(buf, 0)
	}
	return buf
}

func (b *nlBatch) attr(typ uint16, data []byte) {
	if len(data) > math.MaxUint16-4 && b.err == nil {
		b.err = fmt.Errorf("attribute %d of %d bytes is too long", typ, len(data))
	}
	b.buf = appendAttr(b.buf, typ, data)
}

// str writes a NUL-terminated string attribute.
func (b *nlBatch) str(typ uint16, s string) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(s)+1))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *nlBatch) u32(typ uint16, v uint32) { b.attr(typ, be32(v)) }

// nest opens a nested attribute; unnest closes it.
func (b *nlBatch) nest(typ uint16) {
	b.nests = append(b.nests, len(b.buf))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 0)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ|unix.NLA_F_NESTED)
}

func (b *nlBatch) unnest() {
	start := b.nests[len(b.nests)-1]
	b.nests = b.nests[:len(b.nests)-1]
	n := len(b.buf) - start
	if n > math.MaxUint16 && b.err == nil {
		b.err = fmt.Errorf("nested attribute of %d bytes is too long", n)
	}
	binary.NativeEndian.PutUint16(b.buf[start:], uint16(n))
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// baseChainPriority turns knftables' priority names ("dstnat-10") into numbers.
func baseChainPriority(p knftables.BaseChainPriority) (int32, error) {
	named := map[string]int32{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}
	s := string(p)
	i := strings.IndexAny(s, "+-")
	if i <= 0 {
		i = len(s)
	}
	base, ok := named[s[:i]]
	if !ok {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("base chain priority %q", s)
		}
		return int32(n), nil
	}
	if i < len(s) {
		off, err := strconv.ParseInt(s[i:], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("base chain priority %q", s)
		}
		base += int32(off)
	}
	return base, nil
}

var baseChainHooks = map[knftables.BaseChainHook]uint32{
	knftables.PreroutingHook:  unix.NF_INET_PRE_ROUTING,
	knftables.InputHook:       unix.NF_INET_LOCAL_IN,
	knftables.ForwardHook:     unix.NF_INET_FORWARD,
	knftables.OutputHook:      unix.NF_INET_LOCAL_OUT,
	knftables.PostroutingHook: unix.NF_INET_POST_ROUTING,
}

var setFlagBits = map[knftables.SetFlag]uint32{
	knftables.ConstantFlag: unix.NFT_SET_CONSTANT,
	knftables.DynamicFlag:  unix.NFT_SET_EVAL,
	knftables.IntervalFlag: unix.NFT_SET_INTERVAL,
	knftables.TimeoutFlag:  unix.NFT_SET_TIMEOUT,
}

// nlEncoder encodes the commands of one transaction into a batch as they come,
// so a full sync need not hold its whole transaction besides the batch
// (nftTx.stream). Consecutive element commands on the same set share messages.
type nlEncoder struct {
	a    *netlinkApplier
	b    *nlBatch
	enc  *exprEncoder
	keys map[string]*nftSetType // learnt in this batch; nil: deleted
	n    int                    // commands so far
	run  elemRun
	done bool
}

// elemRun is the element message being filled: its verb and set, where its
// element list starts, and how many elements it has.
type elemRun struct {
	open             bool
	verb             nftVerb
	name             string
	t                *nftSetType
	listStart, inMsg int
}

// newEncoder starts a batch, sized for about ops commands.
func (a *netlinkApplier) newEncoder(ops int) *nlEncoder {
	b := &nlBatch{seq: a.seq, first: a.seq, nfproto: a.family.nfproto()}
	e := &nlEncoder{a: a, b: b, enc: &exprEncoder{b: b, cache: a.exprs, family: a.family}, keys: map[string]*nftSetType{}}
	e.grow(ops)
	b.header(unix.NFNL_MSG_BATCH_BEGIN, 0, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	b.end()
	return e
}

// grow makes room for about ops more commands: about 200 bytes a command, so the
// buffer grows once at most.
func (e *nlEncoder) grow(ops int) {
	e.b.buf = slices.Grow(e.b.buf, 200*ops+4096)
	e.b.cmds = slices.Grow(e.b.cmds, ops)
}

func (e *nlEncoder) keyType(name string) *nftSetType {
	if t, ok := e.keys[name]; ok {
		return t
	}
	return e.a.keys[name]
}

// op encodes one command.
func (e *nlEncoder) op(op nftOp) error {
	i := e.n
	e.n++
	a, b := e.a, e.b
	el, isElement := op.obj.(*knftables.Element)
	if e.run.open && (!isElement || op.verb != e.run.verb || elementContainer(el) != e.run.name) {
		e.closeRun()
	}
	var err error
	switch o := op.obj.(type) {
	case *knftables.Table:
		err = a.tableCmd(b, i, op.verb, o)
	case *knftables.Chain:
		err = a.chain(b, i, op.verb, o)
	case *knftables.Rule:
		if op.verb != verbAdd || o.Index != nil || o.Handle != nil {
			return fmt.Errorf("%w: %s: only appending rules is supported", errUnsupportedRule, describeOp(op))
		}
		err = a.rule(b, e.enc, i, o)
	case *knftables.Set:
		err = a.set(b, i, op.verb, o.Name, o.Type, false, o.Flags, o.Timeout, o.Comment, e.keys)
	case *knftables.Map:
		err = a.set(b, i, op.verb, o.Name, o.Type, true, o.Flags, o.Timeout, o.Comment, e.keys)
	case *knftables.Element:
		if !e.run.open {
			name := elementContainer(o)
			t := e.keyType(name)
			if t == nil {
				return fmt.Errorf("%s: type of set %s unknown to the netlink applier", describeOp(op), name)
			}
			if op.verb != verbAdd && op.verb != verbDelete {
				return fmt.Errorf("%s: %w", describeOp(op), errors.New("unsupported"))
			}
			e.run = elemRun{open: true, verb: op.verb, name: name, t: t}
		}
		err = e.element(i, op.verb, o)
	default:
		err = errors.New("unsupported object")
	}
	if err == nil {
		err = b.err
	}
	if err != nil {
		return fmt.Errorf("%s: %w", describeOp(op), err)
	}
	return nil
}

// finish ends the batch. It also returns the set types the batch creates (nil:
// deletes), to remember once it applied.
func (e *nlEncoder) finish() (*nlBatch, map[string]*nftSetType) {
	if !e.done {
		e.closeRun()
		e.b.seq++
		e.b.header(unix.NFNL_MSG_BATCH_END, 0, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
		e.b.end()
		e.done = true
	}
	return e.b, e.keys
}

// encode turns the transaction into one batch, with the set types it creates.
func (a *netlinkApplier) encode(tx *nftTx) (*nlBatch, map[string]*nftSetType, error) {
	e := a.newEncoder(len(tx.ops))
	for _, op := range tx.ops {
		if err := e.op(op); err != nil {
			return nil, nil, err
		}
	}
	b, keys := e.finish()
	return b, keys, nil
}

func (a *netlinkApplier) tableCmd(b *nlBatch, op int, verb nftVerb, t *knftables.Table) error {
	switch verb {
	case verbAdd:
		var ud []byte
		if t.Comment != nil {
			var err error
			if ud, err = udComment(*t.Comment); err != nil {
				return err
			}
		}
		b.begin(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, op, 1)
		b.str(unix.NFTA_TABLE_NAME, a.table)
		b.u32(unix.NFTA_TABLE_FLAGS, 0)
		if ud != nil {
			b.attr(nftaTableUserdata, ud)
		}
	case verbDelete:
		b.begin(unix.NFT_MSG_DELTABLE, 0, op, 1)
		b.str(unix.NFTA_TABLE_NAME, a.table)
	default:
		return errors.New("unsupported")
	}
	b.end()
	return nil
}

func (a *netlinkApplier) chain(b *nlBatch, op int, verb nftVerb, c *knftables.Chain) error {
	switch verb {
	case verbFlush:
		b.begin(unix.NFT_MSG_DELRULE, 0, op, 1)
		b.str(unix.NFTA_RULE_TABLE, a.table)
		b.str(unix.NFTA_RULE_CHAIN, c.Name)
		b.end()
		return nil
	case verbDelete:
		b.begin(unix.NFT_MSG_DELCHAIN, 0, op, 1)
		b.str(unix.NFTA_CHAIN_TABLE, a.table)
		b.str(unix.NFTA_CHAIN_NAME, c.Name)
		b.end()
		return nil
	}
	var hook uint32
	var prio int32
	if c.Hook != nil {
		var ok bool
		hook, ok = baseChainHooks[*c.Hook]
		if !ok || c.Type == nil || c.Priority == nil || c.Device != nil || c.Policy != nil {
			return errors.New("unsupported base chain")
		}
		var err error
		if prio, err = baseChainPriority(*c.Priority); err != nil {
			return err
		}
	}
	var ud []byte
	if c.Comment != nil {
		var err error
		if ud, err = udComment(*c.Comment); err != nil {
			return err
		}
	}
	b.begin(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, op, 1)
	b.str(unix.NFTA_CHAIN_TABLE, a.table)
	b.str(unix.NFTA_CHAIN_NAME, c.Name)
	if c.Hook != nil {
		b.nest(unix.NFTA_CHAIN_HOOK)
		b.u32(unix.NFTA_HOOK_HOOKNUM, hook)
		b.u32(unix.NFTA_HOOK_PRIORITY, uint32(prio))
		b.unnest()
		b.str(unix.NFTA_CHAIN_TYPE, string(*c.Type))
	}
	if ud != nil {
		b.attr(nftaChainUserdata, ud)
	}
	b.end()
	return nil
}

func (a *netlinkApplier) rule(b *nlBatch, enc *exprEncoder, op int, r *knftables.Rule) error {
	var ud []byte
	if r.Comment != nil {
		var err error
		if ud, err = udComment(*r.Comment); err != nil {
			return err
		}
	}
	sets, err := anonSets(a.family, r.Rule)
	if err != nil {
		return err
	}
	enc.anon = enc.anon[:0]
	for _, pfxs := range sets {
		enc.anon = append(enc.anon, a.anonSet(b, op, pfxs))
	}
	b.begin(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, op, 1)
	b.str(unix.NFTA_RULE_TABLE, a.table)
	b.str(unix.NFTA_RULE_CHAIN, r.Chain)
	b.nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := encodeRule(enc, r.Rule); err != nil {
		return err
	}
	b.unnest()
	if ud != nil {
		b.attr(unix.NFTA_RULE_USERDATA, ud)
	}
	b.end()
	return nil
}

func (a *netlinkApplier) set(b *nlBatch, op int, verb nftVerb, name, typ string, isMap bool, flags []knftables.SetFlag,
	timeout *time.Duration, comment *string, keys map[string]*nftSetType) error {
	switch verb {
	case verbDelete:
		keys[name] = nil
		b.begin(unix.NFT_MSG_DELSET, 0, op, 1)
		b.str(unix.NFTA_SET_TABLE, a.table)
		b.str(unix.NFTA_SET_NAME, name)
		b.end()
		return nil
	case verbFlush:
		b.begin(unix.NFT_MSG_DELSETELEM, 0, op, 1)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, a.table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, name)
		b.end()
		return nil
	}
	t, err := parseSetType(typ, isMap)
	if err != nil {
		return err
	}
	var bits uint32
	if isMap {
		bits |= unix.NFT_SET_MAP
	}
	for _, f := range flags {
		bit, ok := setFlagBits[f]
		if !ok {
			return fmt.Errorf("unsupported flag %q", f)
		}
		bits |= bit
	}
	ud, err := t.userdata(comment)
	if err != nil {
		return err
	}
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, op, 1)
	b.str(unix.NFTA_SET_TABLE, a.table)
	b.str(unix.NFTA_SET_NAME, name)
	b.u32(unix.NFTA_SET_FLAGS, bits)
	b.u32(unix.NFTA_SET_KEY_TYPE, t.typeID())
	b.u32(unix.NFTA_SET_KEY_LEN, t.keyLen)
	if isMap {
		b.u32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		b.u32(unix.NFTA_SET_DATA_LEN, 0)
	}
	b.setID++
	b.u32(unix.NFTA_SET_ID, b.setID)
	if timeout != nil {
		b.attr(unix.NFTA_SET_TIMEOUT, binary.BigEndian.AppendUint64(nil, uint64(timeout.Milliseconds())))
	}
	b.attr(unix.NFTA_SET_USERDATA, ud)
	b.end()
	keys[name] = t
	return nil
}

// udAnonSaddrSet is the userdata of an anonymous "ip saddr" (or "ip6 saddr")
// interval set, as nft 1.0.6 writes it: key byte order big endian, merge elements,
// and the typeof of the payload expression the set was built from (nft's protocol
// description number and header field index: ip is 12 with saddr 11, ip6 is 13
// with saddr 8).
func udAnonSaddrSet(f Family) []byte {
	desc, field := uint32(12), uint32(11)
	if f == IPv6 {
		desc, field = 13, 8
	}
	return slices.Concat(
		[]byte{0, 4}, hostU32(2),
		[]byte{2, 4}, hostU32(1),
		[]byte{3, 20, 0, 4}, hostU32(7), []byte{1, 12, 0, 4}, hostU32(desc), []byte{1, 4}, hostU32(field))
}

// udIntervalOpen is the element userdata nft puts on an interval that runs to the
// end of the address space (no end element follows it).
var udIntervalOpen = slices.Concat([]byte{1, 4}, hostU32(1))

// anonSet writes the messages nft sends before a rule using "ip saddr { ... }":
// a constant anonymous interval set, and its elements. It returns the set's ID in
// the batch, which the rule's lookup names.
func (a *netlinkApplier) anonSet(b *nlBatch, op int, pfxs []netip.Prefix) uint32 {
	elems := intervalElements(pfxs)
	keyLen := uint32(4)
	if a.family == IPv6 {
		keyLen = 16
	}
	b.setID++
	id := b.setID
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, op, 1)
	b.str(unix.NFTA_SET_TABLE, a.table)
	b.str(unix.NFTA_SET_NAME, anonSetName)
	b.u32(unix.NFTA_SET_FLAGS, unix.NFT_SET_ANONYMOUS|unix.NFT_SET_CONSTANT|unix.NFT_SET_INTERVAL)
	b.u32(unix.NFTA_SET_KEY_TYPE, nftDatatypes[a.family.addrType()].id)
	b.u32(unix.NFTA_SET_KEY_LEN, keyLen)
	b.u32(unix.NFTA_SET_ID, id)
	b.nest(unix.NFTA_SET_DESC)
	b.u32(unix.NFTA_SET_DESC_SIZE, uint32(len(elems)))
	b.unnest()
	b.attr(unix.NFTA_SET_USERDATA, udAnonSaddrSet(a.family))
	b.end()
	b.begin(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, op, 1)
	b.str(unix.NFTA_SET_ELEM_LIST_TABLE, a.table)
	b.str(unix.NFTA_SET_ELEM_LIST_SET, anonSetName)
	b.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
	b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	for _, e := range elems {
		b.nest(unix.NFTA_LIST_ELEM)
		if e.end {
			b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
		}
		b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, e.key.AsSlice())
		b.unnest()
		if e.open {
			b.attr(unix.NFTA_SET_ELEM_USERDATA, udIntervalOpen)
		}
		b.unnest()
	}
	b.unnest()
	b.end()
	return id
}

// intervalElement is one element of an interval set: the start of a range, or
// (end) the first address after one.
type intervalElement struct {
	key  netip.Addr
	end  bool
	open bool // a start whose range runs to the last address of the family
}

// intervalElements turns prefixes (all of one family) into the elements nft writes
// for them: ranges sorted, overlapping and adjacent ones merged (nft's automerge),
// each a start and an end element, with an end element at the first address
// (0.0.0.0 or ::) first unless a range starts there, and no end element after a
// range that reaches the last address.
func intervalElements(pfxs []netip.Prefix) []intervalElement {
	// [lo, hi); an invalid hi is the end of the address space.
	type span struct{ lo, hi netip.Addr }
	after := func(p netip.Prefix) netip.Addr {
		last := p.Masked().Addr().AsSlice()
		for i := p.Bits(); i < len(last)*8; i++ {
			last[i/8] |= 0x80 >> (i % 8)
		}
		a, _ := netip.AddrFromSlice(last)
		return a.Next()
	}
	spans := make([]span, 0, len(pfxs))
	for _, p := range pfxs {
		spans = append(spans, span{p.Masked().Addr(), after(p)})
	}
	slices.SortFunc(spans, func(x, y span) int { return x.lo.Compare(y.lo) })
	merged := spans[:0]
	for _, sp := range spans {
		if n := len(merged); n > 0 && (!merged[n-1].hi.IsValid() || sp.lo.Compare(merged[n-1].hi) <= 0) {
			if merged[n-1].hi.IsValid() && (!sp.hi.IsValid() || sp.hi.Compare(merged[n-1].hi) > 0) {
				merged[n-1].hi = sp.hi
			}
			continue
		}
		merged = append(merged, sp)
	}
	var out []intervalElement
	if len(merged) > 0 && !merged[0].lo.IsUnspecified() {
		first := netip.IPv4Unspecified()
		if merged[0].lo.Is6() {
			first = netip.IPv6Unspecified()
		}
		out = append(out, intervalElement{key: first, end: true})
	}
	for _, sp := range merged {
		if !sp.hi.IsValid() {
			out = append(out, intervalElement{key: sp.lo, open: true})
			continue
		}
		out = append(out, intervalElement{key: sp.lo}, intervalElement{key: sp.hi, end: true})
	}
	return out
}

// verdictCode reads a verdict-map value ("goto chain", "jump chain", "drop").
func verdictCode(value []string) (int32, string, error) {
	if len(value) != 1 {
		return 0, "", fmt.Errorf("verdict %q", value)
	}
	verb, chain, _ := strings.Cut(value[0], " ")
	var code int32
	switch verb {
	case "drop":
		code = nfDrop
	case "accept":
		code = nfAccept
	case "goto":
		code = unix.NFT_GOTO
	case "jump":
		code = unix.NFT_JUMP
	default:
		return 0, "", fmt.Errorf("verdict %q", value[0])
	}
	if (chain == "") != (code == nfDrop || code == nfAccept) {
		return 0, "", fmt.Errorf("verdict %q", value[0])
	}
	return code, chain, nil
}

// element adds one element command (command i) to the open run, in messages of
// at most nftElementsPerMessage elements whose list stays under an attribute's
// 64 KiB.
func (e *nlEncoder) element(i int, verb nftVerb, el *knftables.Element) error {
	b, r := e.b, &e.run
	describe := func() string { return describeOp(nftOp{verb, el}) }
	key, err := r.t.encodeKey(el.Key)
	if err != nil {
		return fmt.Errorf("%s: %w", describe(), err)
	}
	var code int32
	var chain string
	var ud []byte
	if verb == verbAdd {
		if r.t.isMap {
			if code, chain, err = verdictCode(el.Value); err != nil {
				return fmt.Errorf("%s: %w", describe(), err)
			}
		} else if len(el.Value) != 0 {
			return fmt.Errorf("%s: a set element has no value", describe())
		}
		if el.Comment != nil {
			if ud, err = udComment(*el.Comment); err != nil {
				return fmt.Errorf("%s: %w", describe(), err)
			}
		}
	}
	// Start a new message when this one is full; an element is at most a few
	// hundred bytes (key, chain name, comment).
	if r.inMsg == 0 || r.inMsg >= nftElementsPerMessage || len(b.buf)-r.listStart > nftMaxElementListBytes-1024 {
		if r.inMsg > 0 {
			b.unnest()
			b.end()
		}
		typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(unix.NLM_F_CREATE)
		if verb == verbDelete {
			typ, flags = unix.NFT_MSG_DELSETELEM, 0
		}
		b.begin(typ, flags, i, 0)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.a.table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, r.name)
		b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		r.listStart, r.inMsg = len(b.buf), 0
	}
	b.cmds[len(b.cmds)-1].n++
	b.nest(unix.NFTA_LIST_ELEM)
	b.nest(unix.NFTA_SET_ELEM_KEY)
	b.attr(unix.NFTA_DATA_VALUE, key)
	b.unnest()
	if verb == verbAdd && r.t.isMap {
		b.nest(unix.NFTA_SET_ELEM_DATA)
		b.nest(unix.NFTA_DATA_VERDICT)
		b.u32(unix.NFTA_VERDICT_CODE, uint32(code))
		if chain != "" {
			b.str(unix.NFTA_VERDICT_CHAIN, chain)
		}
		b.unnest()
		b.unnest()
	}
	if ud != nil {
		b.attr(unix.NFTA_SET_ELEM_USERDATA, ud)
	}
	b.unnest()
	r.inMsg++
	return nil
}

// closeRun ends the element message being filled, if any.
func (e *nlEncoder) closeRun() {
	if e.run.open && e.run.inMsg > 0 {
		e.b.unnest()
		e.b.end()
	}
	e.run = elemRun{}
}

// nftMaxElementListBytes keeps an element list attribute under the 64 KiB an
// attribute length can describe.
const nftMaxElementListBytes = 60000

// describe names the command(s) of the message with sequence number seq;
// name(i) names the transaction's command i.
func (b *nlBatch) describe(name func(int) string, seq uint32) string {
	i := int(seq - b.first - 1)
	if seq == b.first || i < 0 || i >= len(b.cmds) {
		return "commit"
	}
	c := b.cmds[i]
	d := name(c.op)
	if c.n > 1 {
		d = fmt.Sprintf("%s (and %d more elements)", d, c.n-1)
	}
	return d
}

// apply encodes tx and sends it as one batch.
func (a *netlinkApplier) apply(ctx context.Context, tx *nftTx) error {
	if len(tx.ops) == 0 {
		return nil
	}
	b, keys, err := a.encode(tx)
	if err != nil {
		return err
	}
	return a.send(ctx, b, keys, func(i int) string { return describeOp(tx.ops[i]) })
}

// send sends an encoded batch; name(i) names its command i in errors. Only the
// last command asks for an acknowledgement: the kernel reports every failing
// command anyway, and answers a commit failure with an error on the batch header;
// all answers are queued before the send returns, as the kernel handles a batch
// inside the send call.
func (a *netlinkApplier) send(ctx context.Context, b *nlBatch, keys map[string]*nftSetType, name func(int) string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	last := b.seq - 1 // the last command; b.seq is BATCH_END
	// Set NLM_F_ACK on the last command: find its header by walking the buffer.
	for off := 0; off < len(b.buf); {
		n := int(binary.NativeEndian.Uint32(b.buf[off:]))
		if binary.NativeEndian.Uint32(b.buf[off+8:]) == last {
			flags := binary.NativeEndian.Uint16(b.buf[off+6:])
			binary.NativeEndian.PutUint16(b.buf[off+6:], flags|unix.NLM_F_ACK)
			break
		}
		off += (n + 3) &^ 3
	}
	a.seq = b.seq + 1

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	// A batch is one datagram: the send buffer must hold all of it. Errors carry
	// only the failing message's header (CAP_ACK), with the kernel's text (EXT_ACK).
	sndbuf := max(len(b.buf)+(1<<16), 1<<20)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sndbuf); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndbuf); err != nil {
			return fmt.Errorf("netlink send buffer of %d bytes: %w", sndbuf, err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	wait := nftReplyTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = max(time.Until(d), time.Millisecond)
	}
	tv := unix.NsecToTimeval(wait.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("netlink receive timeout: %w", err)
	}
	if err := unix.Sendto(fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send batch of %d bytes: %w", len(b.buf), err)
	}
	if err := receiveBatchAnswer(fd, b, name, last); err != nil {
		return err
	}
	for name, t := range keys {
		if t == nil {
			delete(a.keys, name)
		} else {
			a.keys[name] = t
		}
	}
	return nil
}

// receiveBatchAnswer reads the kernel's answers to a batch until the one to the
// last command, and returns every error found, each naming its command.
func receiveBatchAnswer(fd int, b *nlBatch, name func(int) string, last uint32) error {
	var errs []error
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ENOBUFS) {
				// Only errors are queued besides the one acknowledgement, so
				// answers were lost because there were many errors.
				errs = append(errs, fmt.Errorf("kernel answers lost: %w", err))
				return errors.Join(errs...)
			}
			return errors.Join(append(errs, fmt.Errorf("waiting for the kernel's answer: %w", err))...)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("parse kernel answer: %w", err))...)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4+unix.NLMSG_HDRLEN {
				continue
			}
			code := -int32(binary.NativeEndian.Uint32(m.Data))
			seq := binary.NativeEndian.Uint32(m.Data[4+8:])
			if code != 0 {
				what := b.describe(name, seq)
				e := fmt.Errorf("%s: %w", what, syscall.Errno(code))
				if text := extAckText(m); text != "" {
					e = fmt.Errorf("%s: %w (%s)", what, syscall.Errno(code), text)
				}
				errs = append(errs, e)
				if seq == b.first {
					// The batch header itself was refused, or the commit failed:
					// nothing was applied.
					return errors.Join(errs...)
				}
			}
			if seq == last {
				return errors.Join(errs...)
			}
		}
	}
}

// extAckText is the kernel's message in an extended acknowledgement, if any.
func extAckText(m syscall.NetlinkMessage) string {
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 {
		return ""
	}
	inner := int(binary.NativeEndian.Uint32(m.Data[4:]))
	off := 4 + unix.NLMSG_HDRLEN
	if m.Header.Flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + (inner+3)&^3
	}
	if off > len(m.Data) {
		return ""
	}
	attrs, err := netlink.UnmarshalAttributes(m.Data[off:])
	if err != nil {
		return ""
	}
	for _, at := range attrs {
		if at.Type == unix.NLMSGERR_ATTR_MSG {
			return strings.TrimRight(string(at.Data), "\x00")
		}
	}
	return ""
}

// list reads the table's chain or set names over netlink (full syncs only).
func (a *netlinkApplier) list(_ context.Context, kind string) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	family := nftables.TableFamilyIPv4
	if a.family == IPv6 {
		family = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(family)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	var table *nftables.Table
	for _, t := range tables {
		if t.Name == a.table {
			table = t
		}
	}
	if table == nil {
		return nil, nil
	}
	var names []string
	switch kind {
	case "chain":
		chains, err := c.ListChainsOfTableFamily(family)
		if err != nil {
			return nil, fmt.Errorf("list chains: %w", err)
		}
		for _, ch := range chains {
			if ch.Table.Name == a.table {
				names = append(names, ch.Name)
			}
		}
	case "set":
		sets, err := c.GetSets(table)
		if err != nil {
			return nil, fmt.Errorf("list sets: %w", err)
		}
		for _, s := range sets {
			if !s.Anonymous {
				names = append(names, s.Name)
			}
		}
	default:
		return nil, fmt.Errorf("list %q", kind)
	}
	return names, nil
}
