package staticpod

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"

	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// maxDecodeErrors caps how many field errors one file reports, so a file of garbage
// does not produce a wall of text.
const maxDecodeErrors = 10

// Decode strictly decodes one manifest (YAML or JSON) into a Pod, without the
// kubelet's defaulting or validation (see Load for the whole pipeline). path only
// names the file in errors. The file must hold exactly one document of apiVersion v1
// and kind Pod; unknown fields and values of the wrong type are errors that carry the
// line, column and field path. On failure the error is a *ManifestError.
func Decode(path string, data []byte) (*corev1.Pod, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, manifestErr(path, ErrWrongKind, "the file is empty: expected a v1 Pod")
		}
		return nil, syntaxErr(path, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, syntaxErr(path, err)
	case !isEmptyDocument(&next):
		e := manifestErr(path, ErrMultipleDocuments,
			"a second YAML document starts here; a manifest file holds exactly one Pod (the kubelet would silently ignore everything after the first document)")
		e.Line = next.Line
		return nil, e
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root = resolveAlias(root)
	if root.Kind != yaml.MappingNode {
		e := manifestErr(path, ErrWrongKind, "expected a v1 Pod object, found %s", describeNode(root))
		e.Line, e.Column = root.Line, root.Column
		return nil, e
	}
	if err := checkTypeMeta(path, root); err != nil {
		return nil, err
	}

	w := walker{path: path}
	w.walk(root, podType, "")
	if len(w.errs) > 0 {
		return nil, joinManifestErrors(w.errs)
	}

	// The walker has vetted field names and scalar types with positions; the JSON
	// round trip below does the real decoding, including the json.Unmarshaler types
	// (quantities, int-or-string, times). It is strict too, as a second line of defence.
	generic, err := nodeToJSON(root)
	if err != nil {
		return nil, manifestErr(path, ErrSyntax, "%v", err)
	}
	raw, err := json.Marshal(generic)
	if err != nil {
		return nil, manifestErr(path, ErrSyntax, "cannot convert to JSON: %v", err)
	}
	jd := json.NewDecoder(bytes.NewReader(raw))
	jd.DisallowUnknownFields()
	pod := &corev1.Pod{}
	if err := jd.Decode(pod); err != nil {
		return nil, jsonErr(path, root, err)
	}
	return pod, nil
}

var podType = reflect.TypeFor[corev1.Pod]()

func isEmptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// syntaxErr turns a yaml.v3 parse error ("yaml: line 7: did not find expected key")
// into a ManifestError with the line pulled out.
//
// yaml.v3 reports scanner errors with a 1-based line but parser errors (the "did not
// find expected ..." family) with the 0-based line of the construct, and omits the
// line altogether when it is 0; this undoes both quirks.
func syntaxErr(path string, err error) *ManifestError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &ManifestError{Path: path, Kind: ErrSyntax, Detail: msg, Line: 1}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ":"); ok {
			if n, convErr := strconv.Atoi(num); convErr == nil {
				e.Line = n
				e.Detail = strings.TrimSpace(tail)
				if strings.HasPrefix(e.Detail, "did not find expected") {
					e.Line++
				}
			}
		}
	}
	return e
}

func checkTypeMeta(path string, root *yaml.Node) error {
	kind, kindNode := mappingValue(root, "kind")
	apiVersion, avNode := mappingValue(root, "apiVersion")
	if kindNode == nil {
		e := manifestErr(path, ErrWrongKind, "kind is missing: expected apiVersion: v1 and kind: Pod")
		e.Line, e.Column = root.Line, root.Column
		return e
	}
	if kind != "Pod" {
		e := manifestErr(path, ErrWrongKind, "kind %q: the kubelet runs only kind Pod from a manifest folder (lists are read only from an HTTP source)", kind)
		e.Field, e.Line, e.Column = "kind", kindNode.Line, kindNode.Column
		return e
	}
	if avNode == nil {
		e := manifestErr(path, ErrWrongKind, "apiVersion is missing: expected v1")
		e.Line, e.Column = root.Line, root.Column
		return e
	}
	if apiVersion != "v1" {
		e := manifestErr(path, ErrWrongKind, "apiVersion %q: a Pod is apiVersion v1", apiVersion)
		e.Field, e.Line, e.Column = "apiVersion", avNode.Line, avNode.Column
		return e
	}
	return nil
}

func mappingValue(m *yaml.Node, key string) (string, *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := resolveAlias(m.Content[i+1])
			return v.Value, v
		}
	}
	return "", nil
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "an object"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("the string %q", truncate(n.Value))
		case "!!bool":
			return fmt.Sprintf("the boolean %s", n.Value)
		case "!!int", "!!float":
			return fmt.Sprintf("the number %s", truncate(n.Value))
		}
		return fmt.Sprintf("the value %q", truncate(n.Value))
	}
	return "nothing"
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// walker checks a YAML node tree against the Go type it will decode into.
type walker struct {
	path string
	errs []*ManifestError
}

func (w *walker) fail(n *yaml.Node, field string, kind error, format string, args ...any) {
	if len(w.errs) >= maxDecodeErrors {
		return
	}
	w.errs = append(w.errs, &ManifestError{
		Path: w.path, Line: n.Line, Column: n.Column, Field: field, Kind: kind,
		Detail: fmt.Sprintf(format, args...),
	})
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	quantityType    = reflect.TypeFor[resource.Quantity]()
	intOrStringType = reflect.TypeFor[intstr.IntOrString]()
)

func (w *walker) walk(n *yaml.Node, t reflect.Type, field string) {
	if len(w.errs) >= maxDecodeErrors {
		return
	}
	n = resolveAlias(n)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // null leaves the zero value, as in JSON
	}
	switch t {
	case quantityType:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float") {
			w.fail(n, field, ErrFieldType, "expected a quantity such as 250m or 1Gi, found %s", describeNode(n))
		} else if _, err := resource.ParseQuantity(n.Value); err != nil {
			w.fail(n, field, ErrFieldType, "%q is not a quantity (such as 250m or 1Gi): %v", n.Value, err)
		}
		return
	case intOrStringType:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
			w.fail(n, field, ErrFieldType, "expected a number or a name, found %s", describeNode(n))
		}
		return
	}
	// Other types with their own JSON decoding (metav1.Time, RawExtension) are left
	// to the JSON step.
	if t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.fail(n, field, ErrFieldType, "expected an object, found %s", describeNode(n))
			return
		}
		fields := structFields(t)
		w.eachPair(n, field, func(key, val *yaml.Node) {
			sub := joinField(field, key.Value)
			f, ok := fields[key.Value]
			if !ok {
				w.fail(key, sub, ErrUnknownField, "unknown field %q%s", key.Value, suggest(key.Value, fields))
				return
			}
			w.walk(val, f, sub)
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.fail(n, field, ErrFieldType, "expected an object, found %s", describeNode(n))
			return
		}
		w.eachPair(n, field, func(key, val *yaml.Node) {
			w.walk(val, t.Elem(), joinField(field, key.Value))
		})
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			if n.Kind != yaml.ScalarNode {
				w.fail(n, field, ErrFieldType, "expected base64 text, found %s", describeNode(n))
			}
			return
		}
		if n.Kind != yaml.SequenceNode {
			w.fail(n, field, ErrFieldType, "expected a list, found %s", describeNode(n))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", field, i))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!timestamp") {
			w.fail(n, field, ErrFieldType, "expected a string, found %s (quote it)", describeNode(n))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			w.fail(n, field, ErrFieldType, "expected true or false, found %s", describeNode(n))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		w.checkInt(n, t, field, true)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		w.checkInt(n, t, field, false)
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			w.fail(n, field, ErrFieldType, "expected a number, found %s", describeNode(n))
		}
	case reflect.Interface:
		// Free-form; the JSON step decodes whatever is there.
	}
}

func (w *walker) checkInt(n *yaml.Node, t reflect.Type, field string, signed bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		w.fail(n, field, ErrFieldType, "expected an integer, found %s", describeNode(n))
		return
	}
	var v any
	if err := n.Decode(&v); err != nil {
		w.fail(n, field, ErrFieldType, "bad integer %q: %v", n.Value, err)
		return
	}
	var overflow bool
	switch x := v.(type) {
	case int:
		if signed {
			overflow = reflect.New(t).Elem().OverflowInt(int64(x))
		} else {
			overflow = x < 0 || reflect.New(t).Elem().OverflowUint(uint64(x))
		}
	case int64:
		overflow = !signed && x < 0
	case uint64:
		overflow = signed && x > 1<<63-1
	}
	if overflow {
		w.fail(n, field, ErrFieldType, "integer %s is out of range for this field", n.Value)
	}
}

// eachPair walks a mapping's key/value pairs, following YAML merge keys (<<) and
// refusing keys that are not strings.
func (w *walker) eachPair(n *yaml.Node, field string, fn func(key, val *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.Kind == yaml.ScalarNode && key.Tag == "!!merge" {
			val = resolveAlias(val)
			switch val.Kind {
			case yaml.MappingNode:
				w.eachPair(val, field, fn)
			case yaml.SequenceNode:
				for _, m := range val.Content {
					if m = resolveAlias(m); m.Kind == yaml.MappingNode {
						w.eachPair(m, field, fn)
					}
				}
			}
			continue
		}
		if key.Kind != yaml.ScalarNode {
			w.fail(key, field, ErrFieldType, "object keys must be strings, found %s", describeNode(key))
			continue
		}
		if line, dup := seen[key.Value]; dup {
			w.fail(key, joinField(field, key.Value), ErrSyntax, "key %q is repeated (first at line %d)", key.Value, line)
			continue
		}
		seen[key.Value] = key.Line
		fn(key, val)
	}
}

func joinField(parent, name string) string {
	if parent == "" {
		return name
	}
	if strings.ContainsAny(name, ".[]/ ") {
		return fmt.Sprintf("%s[%q]", parent, name)
	}
	return parent + "." + name
}

// suggest offers the closest known field name for a likely typo.
func suggest(name string, fields map[string]reflect.Type) string {
	best, bestDist := "", 3
	for f := range fields {
		if d := editDistance(strings.ToLower(name), strings.ToLower(f)); d < bestDist || (d == bestDist && best != "" && f < best) {
			best, bestDist = f, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// structFields maps JSON names to field types the way encoding/json does, including
// the fields promoted from embedded structs (TypeMeta in Pod).
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range structFields(ft) {
					if _, exists := m[k]; !exists {
						m[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}

// nodeToJSON converts a node tree to values encoding/json marshals. Plain scalars
// that are not numbers, booleans or null keep their exact text (a date stays the text
// the user wrote).
func nodeToJSON(n *yaml.Node) (any, error) {
	n = resolveAlias(n)
	switch n.Kind {
	case yaml.MappingNode:
		out := map[string]any{}
		if err := mergeInto(out, n); err != nil {
			return nil, err
		}
		return out, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, err := nodeToJSON(item)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil, nil
		case "!!bool", "!!int", "!!float":
			var v any
			if err := n.Decode(&v); err != nil {
				return nil, fmt.Errorf("line %d: %v", n.Line, err)
			}
			if f, ok := v.(float64); ok && (f != f || f > math.MaxFloat64 || f < -math.MaxFloat64) {
				return nil, fmt.Errorf("line %d: the number %s cannot be represented in JSON", n.Line, n.Value)
			}
			return v, nil
		}
		return n.Value, nil
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

func mergeInto(out map[string]any, n *yaml.Node) error {
	// Merged keys come first so the mapping's own keys override them.
	for i := 0; i+1 < len(n.Content); i += 2 {
		if key := n.Content[i]; key.Tag == "!!merge" {
			val := resolveAlias(n.Content[i+1])
			srcs := []*yaml.Node{val}
			if val.Kind == yaml.SequenceNode {
				srcs = val.Content
			}
			for _, src := range srcs {
				if src = resolveAlias(src); src.Kind == yaml.MappingNode {
					if err := mergeInto(out, src); err != nil {
						return err
					}
				}
			}
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i]
		if key.Tag == "!!merge" {
			continue
		}
		v, err := nodeToJSON(n.Content[i+1])
		if err != nil {
			return err
		}
		out[key.Value] = v
	}
	return nil
}

// jsonErr reports an error from the JSON step, locating the field when it can.
func jsonErr(path string, root *yaml.Node, err error) *ManifestError {
	e := &ManifestError{Path: path, Kind: ErrFieldType, Detail: strings.TrimPrefix(err.Error(), "json: ")}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		e.Field = typeErr.Field
		if n := findField(root, strings.Split(typeErr.Field, ".")); n != nil {
			e.Line, e.Column = n.Line, n.Column
		}
		e.Detail = fmt.Sprintf("cannot use a JSON %s here (want %s)", typeErr.Value, typeErr.Type)
	}
	if strings.Contains(err.Error(), "unknown field") {
		e.Kind = ErrUnknownField
	}
	return e
}

// findField returns the first node along a dotted path, searching every list item.
func findField(n *yaml.Node, parts []string) *yaml.Node {
	n = resolveAlias(n)
	if len(parts) == 0 {
		return n
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == parts[0] {
				if found := findField(n.Content[i+1], parts[1:]); found != nil {
					return found
				}
			}
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			if found := findField(item, parts); found != nil {
				return found
			}
		}
	}
	return nil
}

// joinManifestErrors keeps one *ManifestError as the result (the first, which is what
// a user fixes first) and folds the others into its Detail.
func joinManifestErrors(errs []*ManifestError) *ManifestError {
	first := *errs[0]
	if len(errs) > 1 {
		var b strings.Builder
		b.WriteString(first.Detail)
		for _, e := range errs[1:] {
			b.WriteString("; also ")
			b.WriteString(strings.TrimPrefix(e.Error(), e.Path+":"))
		}
		first.Detail = b.String()
	}
	return &first
}
