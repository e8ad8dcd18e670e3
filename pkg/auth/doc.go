package auth

import (
	"fmt"
	"strings"
)

// PermissionsMarkdown renders every role's permissions as the tables of
// docs/security.md (the tests hold the page to it). The agent's are shown
// for the queue "default"; {inbox} stands for the user's inbox prefix.
func PermissionsMarkdown() string {
	var b strings.Builder
	for _, role := range Roles {
		p, err := PermissionsFor(role, []string{"default"}, "{inbox}")
		if err != nil {
			panic(err) // every role of Roles has permissions
		}
		p = p.compact()
		fmt.Fprintf(&b, "#### `%s`\n\n", role)
		block := func(what string, l []string) {
			if len(l) == 0 {
				return
			}
			fmt.Fprintf(&b, "%s:\n\n```\n%s\n```\n\n", what, strings.Join(l, "\n"))
		}
		block("May publish", p.PubAllow)
		block("May never publish (wins over the above)", p.PubDeny)
		block("May subscribe", p.SubAllow)
		block("May never subscribe", p.SubDeny)
	}
	return b.String()
}
