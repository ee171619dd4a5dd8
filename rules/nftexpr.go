package rules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// errUnsupportedRule marks rule text outside the closed grammar the netlink applier
// translates. It is a programming error in this package, never silently ignored: the
// sync fails before anything reaches the kernel.
var errUnsupportedRule = errors.New("rule outside the grammar the netlink applier translates")

// ruleExprs translates one rule, as this package writes it for `nft -f`, into the
// kernel expressions nft 1.0.6 generates for the same text (the same registers, the
// same shortened payload loads for byte-aligned prefixes), so that `nft list` shows
// the same ruleset whichever applier wrote it.
//
// The grammar is closed: it is exactly the statements compile and writeBase emit.
// Anything else is an error naming the rule and the token.
//
//	rule      := stmt+
//	stmt      := "ct" ("state" "new" | "status" "dnat")
//	           | "mark" "and" HEX "!=" "0"
//	           | "mark" "set" "mark" ("or" | "xor") HEX
//	           | "numgen" "random" "mod" N N
//	           | "fib" ("daddr" | "saddr") "type" "local"
//	           | "meta" "l4proto" PROTO
//	           | sel ("." sel)* ("@" SET | "vmap" "@" MAP)
//	           | (IP "saddr" | IP "daddr") ["!="] (ADDR | PREFIX | "{" PREFIX "}")
//	           | IP "saddr" ["!="] "{" PREFIX ("," PREFIX)+ "}"
//	           | "update" "@" SET "{" IP "saddr" "}"
//	           | "dnat" "to" (ADDR4 | "[" ADDR6 "]") ":" PORT
//	           | "masquerade" "fully-random" | "reject" | "drop" | "accept"
//	           | ("jump" | "goto") CHAIN
//	sel       := IP "saddr" | IP "daddr" | "meta l4proto" | "th dport"
//	IP        := "ip" (IPv4 writer) | "ip6" (IPv6 writer)
//
// Addresses must be of the writer's family.
func ruleExprs(family Family, rule string) ([]expr.Any, error) {
	p := &ruleParser{toks: strings.Fields(rule), family: family}
	if len(p.toks) == 0 {
		return nil, fmt.Errorf("%w: empty rule", errUnsupportedRule)
	}
	if err := p.parse(rule); err != nil {
		return nil, err
	}
	return p.out, nil
}

func (p *ruleParser) parse(rule string) error {
	for p.i < len(p.toks) {
		if err := p.stmt(); err != nil {
			return fmt.Errorf("%w: %q at token %d: %v", errUnsupportedRule, rule, p.i, err)
		}
	}
	if p.err != nil {
		return fmt.Errorf("rule %q: %w", rule, p.err)
	}
	return nil
}

// encodeRule appends the rule's expressions, encoded, to enc's batch.
func encodeRule(enc *exprEncoder, rule string) error {
	p := &ruleParser{toks: strings.Fields(rule), enc: enc, family: enc.family}
	if len(p.toks) == 0 {
		return fmt.Errorf("%w: empty rule", errUnsupportedRule)
	}
	return p.parse(rule)
}

type ruleParser struct {
	family Family
	toks   []string
	i      int
	out    []expr.Any
	// enc, when set, receives the encoded expressions instead of out.
	enc *exprEncoder
	err error
}

// exprEncoder appends expressions, encoded for the kernel, to a rule's expression
// list. Statements whose code depends only on their text ("meta l4proto tcp", the
// DNAT expression, "numgen random mod 3 0") are encoded once per applier: a full
// sync repeats them tens of thousands of times.
type exprEncoder struct {
	b     *nlBatch
	cache map[string][]byte
	key   []byte // scratch for cache keys
	// anon are the set IDs of the anonymous sets created for the rule being
	// encoded, in the order its lookups use them.
	anon []uint32
	// family is the writer's: it picks the family expressions are marshalled for.
	family Family
}

func (e *exprEncoder) encode(exprs []expr.Any) ([]byte, error) {
	var out []byte
	for _, x := range exprs {
		data, err := expr.Marshal(e.family.nfproto(), x)
		if err != nil {
			return nil, err
		}
		out = appendAttr(out, unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
	}
	return out, nil
}

func (p *ruleParser) peek(k int) string {
	if p.i+k < len(p.toks) {
		return p.toks[p.i+k]
	}
	return ""
}

func (p *ruleParser) next() string {
	t := p.peek(0)
	p.i++
	return t
}

// expect consumes the given tokens in order.
func (p *ruleParser) expect(words ...string) error {
	for _, w := range words {
		if got := p.next(); got != w {
			return fmt.Errorf("want %q, got %q", w, got)
		}
	}
	return nil
}

func (p *ruleParser) emit(e ...expr.Any) {
	if p.enc == nil {
		p.out = append(p.out, e...)
		return
	}
	data, err := p.enc.encode(e)
	if err != nil && p.err == nil {
		p.err = err
	}
	p.enc.b.buf = append(p.enc.b.buf, data...)
}

// emitConst emits expressions that are the same wherever the statement's text
// (tokens start to the current one, or key when set) appears.
func (p *ruleParser) emitConst(start int, key string, e ...expr.Any) {
	if p.enc == nil {
		p.out = append(p.out, e...)
		return
	}
	k := append(p.enc.key[:0], key...)
	if key == "" {
		for i, t := range p.toks[start:p.i] {
			if i > 0 {
				k = append(k, ' ')
			}
			k = append(k, t...)
		}
	}
	p.enc.key = k
	data, ok := p.enc.cache[string(k)]
	if !ok {
		var err error
		if data, err = p.enc.encode(e); err != nil {
			if p.err == nil {
				p.err = err
			}
			return
		}
		p.enc.cache[string(k)] = data
	}
	p.enc.b.buf = append(p.enc.b.buf, data...)
}

// hostU32 is a 32-bit value as the kernel keeps meta, ct and fib results: host order.
func hostU32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// Values of the few ct, fib and numgen constants the grammar uses.
const (
	ctStateNew   = 0x08 // NF_CT_STATE_BIT(IP_CT_NEW)
	ctStatusDNAT = 0x20 // IPS_DST_NAT
	rtnLocal     = 2    // RTN_LOCAL, fib "type local"
	regVerdict   = 0    // NFT_REG_VERDICT
	reg1         = 1    // NFT_REG_1
	reg32First   = 8    // NFT_REG32_00
	// icmpPortUnreach and icmpv6PortUnreach are the codes of nft's plain
	// "reject" in the ip and ip6 families.
	icmpPortUnreach   = 3
	icmpv6PortUnreach = 4
)

// nfproto is the family's NFPROTO_ number, as nf_tables messages carry it.
func (f Family) nfproto() uint8 {
	if f == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// addrLen is the family's address length in bytes.
func (f Family) addrLen() uint32 {
	if f == IPv6 {
		return 16
	}
	return 4
}

func (p *ruleParser) stmt() error {
	start := p.i
	switch t := p.next(); t {
	case "ct":
		key, value := expr.CtKeySTATE, uint32(ctStateNew)
		switch w := p.next(); w {
		case "state":
			if err := p.expect("new"); err != nil {
				return err
			}
		case "status":
			if err := p.expect("dnat"); err != nil {
				return err
			}
			key, value = expr.CtKeySTATUS, ctStatusDNAT
		default:
			return fmt.Errorf("ct %q", w)
		}
		p.emitConst(start, "", &expr.Ct{Register: reg1, Key: key},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(value), Xor: hostU32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)})
	case "mark":
		return p.mark(start)
	case "numgen":
		if err := p.expect("random", "mod"); err != nil {
			return err
		}
		mod, err := strconv.ParseUint(p.next(), 10, 32)
		if err != nil || mod == 0 {
			return fmt.Errorf("numgen modulus: %v", err)
		}
		value, err := strconv.ParseUint(p.next(), 10, 32)
		if err != nil || value >= mod {
			return fmt.Errorf("numgen value out of range")
		}
		p.emitConst(start, "", &expr.Numgen{Register: reg1, Modulus: uint32(mod), Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(uint32(value))})
	case "fib":
		addr := p.next()
		if addr != "daddr" && addr != "saddr" {
			return fmt.Errorf("want \"daddr\" or \"saddr\", got %q", addr)
		}
		if err := p.expect("type", "local"); err != nil {
			return err
		}
		p.emitConst(0, "fib "+addr+" type local", &expr.Fib{Register: reg1, FlagDADDR: addr == "daddr", FlagSADDR: addr == "saddr", ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(rtnLocal)})
	case "ip", "ip6", "meta", "th":
		p.i--
		return p.match()
	case "update":
		set, ok := strings.CutPrefix(p.next(), "@")
		if !ok || set == "" {
			return errors.New("update needs @set")
		}
		if err := p.expect("{", p.family.ipX(), "saddr", "}"); err != nil {
			return err
		}
		p.emit(p.ipField("saddr", reg1, p.family.addrLen()),
			&expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE})
	case "dnat":
		if err := p.expect("to"); err != nil {
			return err
		}
		ap, err := netip.ParseAddrPort(p.next())
		if err != nil || !p.family.has(ap.Addr()) {
			return fmt.Errorf("dnat target is not an %s address and port: %v", p.family, err)
		}
		p.emit(&expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()})
		p.emitConst(0, "dnat port "+strconv.Itoa(int(ap.Port())),
			&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, ap.Port())})
		p.emitConst(0, "dnat", &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(p.family.nfproto()), RegAddrMin: 1, RegProtoMin: 2, Specified: true})
	case "masquerade":
		if err := p.expect("fully-random"); err != nil {
			return err
		}
		p.emitConst(0, "masquerade fully-random", &expr.Masq{FullyRandom: true})
	case "reject":
		code := uint8(icmpPortUnreach)
		if p.family == IPv6 {
			code = icmpv6PortUnreach
		}
		p.emitConst(0, "reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
	case "drop":
		p.emitConst(0, "drop", &expr.Verdict{Kind: expr.VerdictDrop})
	case "accept":
		p.emitConst(0, "accept", &expr.Verdict{Kind: expr.VerdictAccept})
	case "jump", "goto":
		chain := p.next()
		if chain == "" {
			return fmt.Errorf("%s needs a chain", t)
		}
		kind := expr.VerdictJump
		if t == "goto" {
			kind = expr.VerdictGoto
		}
		p.emit(&expr.Verdict{Kind: kind, Chain: chain})
	default:
		return fmt.Errorf("unknown statement %q", t)
	}
	return nil
}

// mark handles "mark and M != 0" and "mark set mark or|xor M".
func (p *ruleParser) mark(start int) error {
	load := &expr.Meta{Key: expr.MetaKeyMARK, Register: reg1}
	switch w := p.next(); w {
	case "and":
		m, err := parseHex32(p.next())
		if err != nil {
			return err
		}
		if err := p.expect("!=", "0"); err != nil {
			return err
		}
		p.emitConst(start, "", load,
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(m), Xor: hostU32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)})
	case "set":
		if err := p.expect("mark"); err != nil {
			return err
		}
		op := p.next()
		m, err := parseHex32(p.next())
		if err != nil {
			return err
		}
		var mask uint32
		switch op {
		case "or":
			mask = ^m
		case "xor":
			mask = 0xffffffff
		default:
			return fmt.Errorf("mark set mark %q", op)
		}
		p.emitConst(start, "", load,
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(mask), Xor: hostU32(m)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1})
	default:
		return fmt.Errorf("mark %q", w)
	}
	return nil
}

func parseHex32(s string) (uint32, error) {
	h, ok := strings.CutPrefix(s, "0x")
	if !ok {
		return 0, fmt.Errorf("want a 0x number, got %q", s)
	}
	v, err := strconv.ParseUint(h, 16, 32)
	return uint32(v), err
}

// selector is one packet field a match reads.
type selector struct {
	name string
	size uint32 // bytes
	load func(reg uint32) expr.Any
}

// ipField loads size bytes of the source or destination address from the network
// header: at 12 and 16 in IPv4, 8 and 24 in IPv6.
func (p *ruleParser) ipField(field string, reg, size uint32) expr.Any {
	off := uint32(12)
	if field == "daddr" {
		off = 16
	}
	if p.family == IPv6 {
		off = 8
		if field == "daddr" {
			off = 24
		}
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size}
}

// selectorAt reads IP "saddr", IP "daddr", "meta l4proto" or "th dport", IP being
// the writer's family's "ip" or "ip6".
func (p *ruleParser) selector() (selector, error) {
	a, b := p.next(), p.next()
	if a == p.family.ipX() && (b == "saddr" || b == "daddr") {
		return selector{"ip " + b, p.family.addrLen(), func(r uint32) expr.Any { return p.ipField(b, r, p.family.addrLen()) }}, nil
	}
	switch a + " " + b {
	case "meta l4proto":
		return selector{"meta l4proto", 1, func(r uint32) expr.Any {
			return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r}
		}}, nil
	case "th dport":
		return selector{"th dport", 2, func(r uint32) expr.Any {
			return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
		}}, nil
	}
	return selector{}, fmt.Errorf("unknown selector %q", a+" "+b)
}

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

// match handles set lookups, verdict-map lookups, protocol and address matches.
func (p *ruleParser) match() error {
	start := p.i
	var sels []selector
	for {
		s, err := p.selector()
		if err != nil {
			return err
		}
		sels = append(sels, s)
		if p.peek(0) != "." {
			break
		}
		p.i++
	}
	lookupSet := func(name string, isMap bool) error {
		if name == "" {
			return errors.New("lookup needs @name")
		}
		// A concatenation fills consecutive 32-bit registers; the first is
		// addressed as NFT_REG_1, the rest as NFT_REG32_xx, as nft does.
		words := uint32(0)
		for _, s := range sels {
			reg := uint32(reg1)
			if words > 0 {
				reg = reg32First + words
			}
			p.emit(s.load(reg))
			words += (s.size + 3) / 4
		}
		p.emit(&expr.Lookup{SourceRegister: reg1, SetName: name, DestRegister: regVerdict, IsDestRegSet: isMap})
		return nil
	}
	switch t := p.peek(0); {
	case strings.HasPrefix(t, "@"):
		p.i++
		return lookupSet(strings.TrimPrefix(t, "@"), false)
	case t == "vmap":
		p.i++
		name, ok := strings.CutPrefix(p.next(), "@")
		if !ok {
			return errors.New("vmap needs @map")
		}
		return lookupSet(name, true)
	}
	if len(sels) != 1 {
		return errors.New("a concatenation must be looked up in a set or map")
	}
	switch s := sels[0]; s.name {
	case "meta l4proto":
		proto, ok := protoNumbers[p.next()]
		if !ok {
			return errors.New("unknown protocol")
		}
		p.emitConst(start, "", s.load(reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}})
		return nil
	case "ip saddr", "ip daddr":
		op := expr.CmpOpEq
		if p.peek(0) == "!=" {
			op = expr.CmpOpNeq
			p.i++
		}
		var pfxs []netip.Prefix
		if p.peek(0) == "{" {
			var err error
			if pfxs, err = p.braces(); err != nil {
				return err
			}
		} else {
			pfx, err := parsePrefix(p.next(), p.family)
			if err != nil {
				return err
			}
			pfxs = []netip.Prefix{pfx}
		}
		if len(pfxs) == 1 {
			// One address or prefix, or a one-element anonymous set, which nft
			// turns into the same plain match.
			p.emit(p.prefixMatch(strings.TrimPrefix(s.name, "ip "), op, pfxs[0])...)
			return nil
		}
		if s.name != "ip saddr" {
			return errors.New("an anonymous set of several elements is supported for saddr only")
		}
		// Several elements: a lookup in the anonymous interval set the applier
		// created just before the rule (see anonSets), "!=" inverting it.
		lookup := &expr.Lookup{SourceRegister: reg1, SetName: anonSetName, Invert: op == expr.CmpOpNeq}
		if p.enc != nil {
			if len(p.enc.anon) == 0 {
				return errors.New("anonymous set not created before its rule")
			}
			lookup.SetID, p.enc.anon = p.enc.anon[0], p.enc.anon[1:]
		}
		p.emit(s.load(reg1), lookup)
		return nil
	}
	return fmt.Errorf("nothing to match %s against", sels[0].name)
}

// anonSetName is the name nft gives an anonymous set; the kernel numbers it.
const anonSetName = "__set%d"

// braces reads "{ a , b , ... }": addresses or prefixes separated by "," tokens,
// as knftables.Concat spaces them.
func (p *ruleParser) braces() ([]netip.Prefix, error) {
	if err := p.expect("{"); err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for {
		pfx, err := parsePrefix(p.next(), p.family)
		if err != nil {
			return nil, err
		}
		out = append(out, pfx)
		switch t := p.next(); t {
		case "}":
			return out, nil
		case ",":
		default:
			return nil, fmt.Errorf("want \",\" or \"}\" in an anonymous set, got %q", t)
		}
	}
}

// anonSets returns the element lists of the multi-element anonymous sets of a
// rule (IP "saddr [!=] { ... }"), in the order its lookups use them: the applier
// creates each set before the rule.
func anonSets(family Family, rule string) ([][]netip.Prefix, error) {
	if !strings.Contains(rule, "{") {
		return nil, nil
	}
	p := &ruleParser{toks: strings.Fields(rule), family: family}
	var out [][]netip.Prefix
	for ; p.i < len(p.toks); p.i++ {
		if p.toks[p.i] != family.ipX() || p.peek(1) != "saddr" {
			continue
		}
		j := p.i + 2
		if j < len(p.toks) && p.toks[j] == "!=" {
			j++
		}
		if j >= len(p.toks) || p.toks[j] != "{" {
			continue
		}
		p.i = j
		pfxs, err := p.braces()
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", errUnsupportedRule, rule, err)
		}
		p.i--
		if len(pfxs) > 1 {
			out = append(out, pfxs)
		}
	}
	return out, nil
}

// parsePrefix reads an address (a full-length prefix) or a prefix of family f.
func parsePrefix(s string, f Family) (netip.Prefix, error) {
	var pfx netip.Prefix
	var err error
	if strings.Contains(s, "/") {
		pfx, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(s)
		pfx = netip.PrefixFrom(a, a.BitLen())
	}
	if err != nil || !f.has(pfx.Addr()) {
		return netip.Prefix{}, fmt.Errorf("not an %s address or prefix: %q", f, s)
	}
	return pfx.Masked(), nil
}

// prefixMatch is nft's code for "ip[6] field [!=] prefix": a byte-aligned prefix
// loads only its bytes and compares them; any other length loads the address,
// masks it and compares.
func (p *ruleParser) prefixMatch(field string, op expr.CmpOp, pfx netip.Prefix) []expr.Any {
	addr := pfx.Addr().AsSlice()
	bits := pfx.Bits()
	if bits > 0 && bits%8 == 0 {
		n := uint32(bits / 8)
		return []expr.Any{p.ipField(field, reg1, n), &expr.Cmp{Op: op, Register: reg1, Data: addr[:n]}}
	}
	mask := make([]byte, len(addr))
	for i := range bits {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{p.ipField(field, reg1, uint32(len(addr))),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: op, Register: reg1, Data: addr}}
}
