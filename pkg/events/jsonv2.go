//go:build goexperiment.jsonv2

package events

// JSONv2 says whether this build's encoding/json is its v2
// implementation (the default from Go 1.27, which jetflow's binaries are
// built with; make test/go1.26 tests the packages that explain bad JSON
// with Go 1.26's v1 implementation too). It reads and writes the same
// JSON but for documents nested 10,000 deep (its Decoder counts the
// object a member is in), and its errors differ: a member inside an
// array is named with its index (entries.0.request, not
// entries.request), and an unmarshal method's error names no member
// unless the method names it (TargetVersion.UnmarshalJSONFrom).
const JSONv2 = true
