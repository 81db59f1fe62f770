package loki

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/eventpipe/eventpipe/api/config"
)

// Config is what a user writes for one Loki sink (YAML). Batching, retry and
// filters are the shared runner's (sinks.RunnerConfig); this is the wire.
type Config struct {
	// URL is the full push endpoint, e.g. http://loki:3100/loki/api/v1/push.
	URL string `json:"url" yaml:"url"`
	// Encoding is "protobuf" (snappy-compressed, the default) or "json".
	Encoding string `json:"encoding" yaml:"encoding"`
	// QueryParams are added to every push URL. Real Loki needs none;
	// VictoriaLogs takes disable_message_parsing=1 to keep the JSON line
	// intact as _msg.
	QueryParams map[string]string `json:"query_params" yaml:"query_params"`
	// Timeout bounds one HTTP request (the runner's push_timeout bounds the
	// whole Push, which can be several requests when a batch is split).
	Timeout time.Duration `json:"timeout" yaml:"timeout"`
	// MaxAge: an occurrence older than this is sent with its observed_at
	// (else, when that is older too, the push time) as its entry timestamp
	// (its own time stays in the line and metadata),
	// because Loki refuses samples older than reject_old_samples_max_age
	// (168h by default, often lowered). MaxFuture does the same for clocks
	// that run ahead (Loki's creation_grace_period, 10m by default).
	MaxAge    time.Duration `json:"max_age" yaml:"max_age"`
	MaxFuture time.Duration `json:"max_future" yaml:"max_future"`
	// MaxMessageBytes caps the event message in the line (Loki's default
	// max_line_size is 256 KB); a longer message is cut on a rune boundary
	// and message_truncated is set.
	MaxMessageBytes int `json:"max_message_bytes" yaml:"max_message_bytes"`
	// Labels chooses the stream labels.
	Labels LabelsConfig `json:"labels" yaml:"labels"`
	// Tenant chooses the X-Scope-OrgID header.
	Tenant TenantConfig `json:"tenant" yaml:"tenant"`
	// Auth: basic auth or a bearer token, at most one.
	Auth AuthConfig `json:"auth" yaml:"auth"`
	// TLS for https URLs.
	TLS TLSConfig `json:"tls" yaml:"tls"`
	// AuthErrorsPermanent makes 401/403/404 drop the batch (counted) instead
	// of holding it and retrying until the credentials or the URL are fixed.
	// Off by default: see the package doc.
	AuthErrorsPermanent bool `json:"auth_errors_permanent" yaml:"auth_errors_permanent"`
}

// LabelsConfig: stream labels are few and bounded. Job is the job label
// (empty: none); Static adds fixed name/value pairs; Fields names occurrence
// fields from a fixed allow list (see LabelFields). An empty field value
// omits the label.
type LabelsConfig struct {
	Job    string            `json:"job" yaml:"job"`
	Static map[string]string `json:"static" yaml:"static"`
	Fields []string          `json:"fields" yaml:"fields"`
	// MaxValueBytes caps each label value (after sanitising).
	MaxValueBytes int `json:"max_value_bytes" yaml:"max_value_bytes"`
}

// TenantConfig: Fixed sends one X-Scope-OrgID; FromWorkspace sends the
// sandbox's workspace (Default for unattributed occurrences) and splits a
// batch per tenant. Neither: no header (single-tenant Loki).
type TenantConfig struct {
	Fixed         string `json:"fixed" yaml:"fixed"`
	FromWorkspace bool   `json:"from_workspace" yaml:"from_workspace"`
	Default       string `json:"default" yaml:"default"`
}

// AuthConfig: secrets come from files (read on every push, so a rotated
// secret is picked up without a restart); Password may be inline for tests.
type AuthConfig struct {
	Username        string `json:"username" yaml:"username"`
	Password        string `json:"password" yaml:"password"`
	PasswordFile    string `json:"password_file" yaml:"password_file"`
	BearerTokenFile string `json:"bearer_token_file" yaml:"bearer_token_file"`
}

// TLSConfig: CAFile replaces the system roots for this sink; CertFile and
// KeyFile present a client certificate.
type TLSConfig struct {
	CAFile             string `json:"ca_file" yaml:"ca_file"`
	CertFile           string `json:"cert_file" yaml:"cert_file"`
	KeyFile            string `json:"key_file" yaml:"key_file"`
	ServerName         string `json:"server_name" yaml:"server_name"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify" yaml:"insecure_skip_verify"`
}

// Encodings.
const (
	EncodingProtobuf = "protobuf"
	EncodingJSON     = "json"
)

// Label fields that may become stream labels: each has few values. Never a
// sandbox id, pod name or event id (unbounded: they go in metadata).
const (
	FieldCluster    = "cluster"    // Occurrence.cluster
	FieldNamespace  = "namespace"  // Occurrence.namespace
	FieldWorkspace  = "workspace"  // Occurrence.sandbox.workspace
	FieldGatewayID  = "gateway_id" // Occurrence.sandbox.gateway_id
	FieldType       = "type"       // Occurrence.type
	FieldSource     = "source"     // Occurrence.reporting_component
	FieldRole       = "role"       // Occurrence.role
	FieldImageRole  = "image_role" // Occurrence.image_role
	FieldAttributed = "attributed" // "true"/"false"
)

// LabelFields is the allow list for labels.fields.
var LabelFields = []string{FieldCluster, FieldNamespace, FieldWorkspace, FieldGatewayID, FieldType, FieldSource, FieldRole, FieldImageRole, FieldAttributed}

// Defaults.
const (
	DefaultTimeout         = 10 * time.Second
	DefaultMaxAge          = time.Hour
	DefaultMaxFuture       = 10 * time.Minute
	DefaultMaxMessageBytes = 128 << 10
	DefaultMaxValueBytes   = 128
	DefaultJob             = "eventpipe"
)

// NewDefaultConfig returns a Config for a local Loki; set URL.
func NewDefaultConfig() Config {
	return Config{
		URL:             "http://127.0.0.1:3100/loki/api/v1/push",
		Encoding:        EncodingProtobuf,
		Timeout:         DefaultTimeout,
		MaxAge:          DefaultMaxAge,
		MaxFuture:       DefaultMaxFuture,
		MaxMessageBytes: DefaultMaxMessageBytes,
		Labels: LabelsConfig{
			Job:           DefaultJob,
			Fields:        []string{FieldCluster, FieldNamespace, FieldWorkspace, FieldType, FieldSource},
			MaxValueBytes: DefaultMaxValueBytes,
		},
	}
}

var (
	labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	// Loki's tenant ID rules: at most 150 bytes of [a-zA-Z0-9!-_.*'()].
	tenantRE = regexp.MustCompile(`^[a-zA-Z0-9!\-_.*'()]{1,150}$`)
)

// Validate reports every problem with its YAML path.
func (c Config) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if c.URL == "" {
		add("url", "must not be empty")
	} else if u, err := url.Parse(c.URL); err != nil {
		add("url", "%v", err)
	} else if u.Scheme != "http" && u.Scheme != "https" {
		add("url", "scheme must be http or https, got %q", u.Scheme)
	} else if u.Host == "" {
		add("url", "has no host")
	} else if err := config.DialAddr(hostPort(u)); err != nil {
		add("url", "%v", err)
	}
	if c.Encoding != EncodingProtobuf && c.Encoding != EncodingJSON {
		add("encoding", "must be %q or %q, got %q", EncodingProtobuf, EncodingJSON, c.Encoding)
	}
	for _, k := range sortedKeys(c.QueryParams) {
		if k == "" {
			add("query_params", "empty parameter name")
		}
	}
	if c.Timeout <= 0 {
		add("timeout", "must be positive, got %s", c.Timeout)
	}
	if c.MaxAge <= 0 {
		add("max_age", "must be positive, got %s", c.MaxAge)
	}
	if c.MaxFuture <= 0 {
		add("max_future", "must be positive, got %s", c.MaxFuture)
	}
	if c.MaxMessageBytes < 256 || c.MaxMessageBytes > 16<<20 {
		add("max_message_bytes", "must be between 256 and %d, got %d", 16<<20, c.MaxMessageBytes)
	}

	nLabels := len(c.Labels.Static) + len(c.Labels.Fields)
	seen := map[string]string{}
	if c.Labels.Job != "" {
		nLabels++
		seen["job"] = "labels.job"
		if msg := checkLabelValue(c.Labels.Job, c.Labels.MaxValueBytes); msg != "" {
			add("labels.job", "%s", msg)
		}
	}
	if c.Labels.Job == "" && len(c.Labels.Static) == 0 {
		add("labels", "set labels.job or a labels.static pair: field labels can all be empty for an occurrence, and Loki refuses a stream without labels")
	}
	if nLabels > 15 {
		add("labels", "at most 15 labels (Loki's max_label_names_per_series), got %d", nLabels)
	}
	for _, k := range sortedKeys(c.Labels.Static) {
		p := "labels.static." + k
		if !labelNameRE.MatchString(k) || strings.HasPrefix(k, "__") {
			add(p, "%q is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)", k)
		}
		if prev, dup := seen[k]; dup {
			add(p, "label %q is already set by %s", k, prev)
		}
		v := c.Labels.Static[k]
		if v == "" {
			add(p, "value must not be empty")
		} else if msg := checkLabelValue(v, c.Labels.MaxValueBytes); msg != "" {
			add(p, "%s", msg)
		}
		seen[k] = p
	}
	for i, f := range c.Labels.Fields {
		p := fmt.Sprintf("labels.fields[%d]", i)
		if !slices.Contains(LabelFields, f) {
			add(p, "%q is not allowed as a label (unbounded values belong in structured metadata); allowed: %s", f, strings.Join(LabelFields, ", "))
			continue
		}
		if prev, dup := seen[f]; dup {
			add(p, "label %q is already set by %s", f, prev)
		}
		seen[f] = p
	}
	if c.Labels.MaxValueBytes < 16 || c.Labels.MaxValueBytes > 1024 {
		add("labels.max_value_bytes", "must be between 16 and 1024, got %d", c.Labels.MaxValueBytes)
	}

	t := c.Tenant
	if t.Fixed != "" && t.FromWorkspace {
		add("tenant", "set either fixed or from_workspace, not both")
	}
	if t.Fixed != "" && !tenantRE.MatchString(t.Fixed) {
		add("tenant.fixed", "%q is not a valid tenant ID (at most 150 of [a-zA-Z0-9!-_.*'()])", t.Fixed)
	}
	if t.FromWorkspace {
		if t.Default == "" {
			add("tenant.default", "required with from_workspace (the tenant of unattributed occurrences)")
		} else if !tenantRE.MatchString(t.Default) {
			add("tenant.default", "%q is not a valid tenant ID (at most 150 of [a-zA-Z0-9!-_.*'()])", t.Default)
		}
	} else if t.Default != "" {
		add("tenant.default", "only used with from_workspace")
	}

	a := c.Auth
	if a.Password != "" && a.PasswordFile != "" {
		add("auth", "set password or password_file, not both")
	}
	if (a.Password != "" || a.PasswordFile != "") && a.Username == "" {
		add("auth.username", "required with a password")
	}
	if a.Username != "" && a.BearerTokenFile != "" {
		add("auth", "set basic auth (username) or bearer_token_file, not both")
	}
	if strings.ContainsAny(a.Username, ":\r\n") {
		add("auth.username", "must not contain ':' or line breaks")
	}

	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		add("tls", "cert_file and key_file go together")
	}
	if c.TLS.InsecureSkipVerify && c.TLS.CAFile != "" {
		add("tls", "insecure_skip_verify makes ca_file useless; set one")
	}
	return errors.Join(errs...)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkLabelValue explains why a configured label value would not survive
// sanitising unchanged ("" when it would).
func checkLabelValue(v string, max int) string {
	switch {
	case !utf8.ValidString(v):
		return fmt.Sprintf("value %q is not valid UTF-8", v)
	case strings.TrimSpace(v) != v:
		return fmt.Sprintf("value %q must not start or end with spaces", v)
	case len(v) > max:
		return fmt.Sprintf("value %q is %d bytes, longer than labels.max_value_bytes (%d)", v, len(v), max)
	case sanitizeValue(v, max) != v:
		return fmt.Sprintf("value %q must not contain control characters", v)
	}
	return ""
}

// hostPort is the URL's host:port, the scheme's port when it names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" || strings.HasSuffix(u.Host, ":") {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
