//go:build goexperiment.jsonv2 && go1.27

package events

import (
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"strings"
)

// UnmarshalJSONFrom reads v as UnmarshalJSON does, for encoding/json's
// v2 implementation (Go 1.27's default; from Go 1.27 only, where
// jsontext is part of the release: Go 1.26 with GOEXPERIMENT=jsonv2 is
// not a build jetflow supports), which returns an unmarshal method's error as it is, where the v1
// implementation's decoder names the member at fault in it: so the error
// names it here, as the v2 implementation names a member of its own
// errors (an array's item by its index: items.1.version).
func (v *TargetVersion) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	b, err := dec.ReadValue()
	if err != nil {
		return err
	}
	err = v.UnmarshalJSON(b)
	if ute := (*json.UnmarshalTypeError)(nil); errors.As(err, &ute) && ute.Field == "" {
		var path []string
		for tok := range dec.StackPointer().Tokens() {
			path = append(path, tok)
		}
		ute.Field = strings.Join(path, ".")
	}
	return err
}
