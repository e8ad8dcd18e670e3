//go:build goexperiment.jsonv2

package events

// JSONv2 says whether this build's encoding/json is its v2
// implementation (GOEXPERIMENT=jsonv2, Go 1.27's default), as make builds
// jetflow: the same results and the same errors but for where a syntax
// error is placed (at the byte at fault, not after it), how a member
// inside an array is named (entries.0.request, not entries.request), and
// the member an unmarshal method's error is about, which it does not
// name (ExplainJSON names it: methodMembers).
const JSONv2 = true
