package podenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnvFileValue(t *testing.T) {
	const file = `# settings
  DB_HOST='db.internal'
EMPTY=''
SPACED= 'ignored'
MULTI='line one
line two'   # trailing comment

LAST='x' #c
`
	path := filepath.Join(t.TempDir(), "env")
	require.NoError(t, os.WriteFile(path, []byte(file), 0o644))
	for key, want := range map[string]string{
		"DB_HOST": "db.internal",
		"EMPTY":   "",
		"SPACED":  "",
		"MULTI":   "line one\nline two",
		"LAST":    "x",
		"MISSING": "",
	} {
		got, err := envFileValue(path, key)
		assert.NoError(t, err, key)
		assert.Equal(t, want, got, key)
	}
	for content, want := range map[string]string{
		"NOEQUALS\n":       "invalid environment variable format at line 1: missing '='",
		"=x\n":             "invalid environment variable format at line 1: empty variable name",
		"K ='v'\n":         "invalid environment variable format at line 1: whitespace before '=' is not allowed",
		"K=v\n":            "invalid environment variable format at line 1: value must be enclosed in single quotes",
		"A='1'\nK='open\n": "invalid environment variable format starting at line 2: unclosed single quote",
		// 'it''s' closes after "it" and then meets content after the quote.
		"Q='it''s'\nK='v'\n": "invalid environment variable format at line 1: unexpected content after closing quote",
	} {
		p := filepath.Join(t.TempDir(), "env")
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		_, err := envFileValue(p, "K")
		assert.EqualError(t, err, want, "%q", content)
	}
	_, err := envFileValue(filepath.Join(t.TempDir(), "absent"), "K")
	assert.ErrorContains(t, err, "failed to open environment variable file")
}
