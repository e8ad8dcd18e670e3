//go:build goexperiment.jsonv2

package events

// JSONv2 says whether this build's encoding/json is its v2
// implementation (GOEXPERIMENT=jsonv2 in Go 1.26, the default from Go
// 1.27; jetflow's binaries are built with the v1 one, and make
// test/jsonv2 tests the packages that explain bad JSON with this one). It
// reads and writes the same JSON but for documents nested 10,000 deep
// (its Decoder counts the object a member is in), and its errors differ:
// a syntax error is placed at the byte at fault, not after it; a member
// inside an array is named with its index (entries.0.request, not
// entries.request); and an unmarshal method's error names no member
// unless the method names it (TargetVersion.UnmarshalJSONFrom).
const JSONv2 = true
