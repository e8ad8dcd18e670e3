package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/workflow"
)

// AppliedFile, in the data directory, records the definition (its
// digest) each --apply file held when jetflow dev last applied it.
const AppliedFile = "applied.json"

// applyFiles registers workflow definitions from files and directories,
// at every start. A file unchanged since it was last applied here is not
// applied again over a later version of its workflow (a user's edit of
// an example, applied with jetflow workflow apply): that version stays
// the latest. A changed file is applied, as a new version, whatever it
// changed to (an edit, or a revert to an older version's text).
func applyFiles(ctx context.Context, c *bus.Conn, dataDir string, paths []string, log zerolog.Logger) error {
	if len(paths) == 0 {
		return nil
	}
	store, err := catalog.Open(ctx, c.JS)
	if err != nil {
		return err
	}
	files, err := definitionFiles(paths)
	if err != nil {
		return err
	}
	applied := readApplied(dataDir, log)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		def, err := workflow.Parse(data)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		digest, err := def.Digest()
		if err != nil {
			return fmt.Errorf("apply %s: digest definition: %w", f, err)
		}
		key := f
		if abs, err := filepath.Abs(f); err == nil {
			key = abs
		}
		last, known := applied[key]
		d, err := keepLatest(ctx, store, def, digest, last, known)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		applied[key] = digest
		if d.keep {
			log.Info().Str("file", f).Str("workflow", def.Name).Int("latest", d.latest).
				Msgf("workflow not applied: the file is unchanged, and version %d, applied since, stays the latest (jetflow workflow apply -f %s makes the file's text the latest)", d.latest, f)
			continue
		}
		rec, created, err := store.Apply(ctx, def)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		if created && d.over {
			log.Warn().Str("file", f).Str("workflow", rec.Name).Int("version", rec.Version).Int("replaced", d.latest).
				Msgf("workflow applied: the file changed, and its version %d replaces version %d as the latest, which was applied since this file last was", rec.Version, d.latest)
			continue
		}
		log.Info().Str("file", f).Str("workflow", rec.Name).Int("version", rec.Version).Bool("created", created).Msg("workflow applied")
	}
	if err := writeApplied(dataDir, applied); err != nil {
		// The next start applies by the versions alone (keepLatest).
		log.Warn().Err(err).Str("file", filepath.Join(dataDir, AppliedFile)).Msg("record what was applied")
	}
	return nil
}

// definitionFiles lists the files of paths: each file, and the
// definition files (*.yaml, *.yml, *.json) of each directory.
func definitionFiles(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("apply %s: %w", p, err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("apply %s: %w", p, err)
		}
		for _, e := range entries {
			if ext := strings.ToLower(filepath.Ext(e.Name())); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	return files, nil
}

// decision is what keepLatest decided for a file.
type decision struct {
	latest int  // the workflow's latest version (0 when it has none)
	keep   bool // the file is not applied: latest stays
	// over is an apply of a changed file over a latest version that is
	// not the one this file was last applied as: applied since.
	over bool
}

// keepLatest decides whether def, a file's definition of the given
// digest, is left unapplied because another version of its workflow, the
// latest, was applied after the file's: the file is unchanged since
// jetflow dev last applied it (last, when known), or, without that
// record, it is an older version than the latest. A definition naming
// its version is left to Apply, which stores it once; so is one that is
// the latest already, or whose workflow has none yet (Apply completes an
// apply that stopped before the pointer).
func keepLatest(ctx context.Context, store *catalog.Store, def workflow.Definition, digest, last string, known bool) (decision, error) {
	if def.Version > 0 {
		return decision{}, nil
	}
	cur, err := store.Get(ctx, def.Name, 0)
	if errors.Is(err, catalog.ErrNotFound) {
		return decision{}, nil
	}
	if err != nil {
		return decision{}, err
	}
	d := decision{latest: cur.Version}
	if cur.Digest == digest {
		return d, nil
	}
	if known {
		d.keep = last == digest
		d.over = !d.keep && cur.Digest != last
		return d, nil
	}
	versions, err := store.Versions(ctx, def.Name)
	if err != nil {
		return decision{}, err
	}
	for _, rec := range versions {
		if rec.Digest == digest && rec.Version < cur.Version {
			d.keep = true
		}
	}
	return d, nil
}

// readApplied reads the record of what was applied (file → digest); none
// when it is missing or unreadable.
func readApplied(dataDir string, log zerolog.Logger) map[string]string {
	out := map[string]string{}
	if dataDir == "" {
		return out
	}
	path := filepath.Join(dataDir, AppliedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		log.Warn().Err(err).Str("file", path).Msg("read what was applied before: applying by the versions alone")
		return map[string]string{}
	}
	return out
}

// writeApplied replaces the record of what was applied.
func writeApplied(dataDir string, applied map[string]string) error {
	if dataDir == "" {
		return nil
	}
	b, err := json.MarshalIndent(applied, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dataDir, AppliedFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
