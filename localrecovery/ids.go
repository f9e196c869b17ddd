package localrecovery

import (
	"bytes"
	"encoding/binary"
	"encoding/json"

	"github.com/ckpt-io/ckpt/manifests"
)

// The .ids record of a complete local checkpoint holds the identity of
// each file of its manifest, in the manifest's order (the names are the
// manifest's):
//
//	idsMagic | uvarint count | per file: uvarint dev, ino | varint size, mtime
//
// A zero identity (inode 0 exists on no filesystem) is a file whose
// identity is unknown. About 20 bytes a file, written at every checkpoint:
// a JSON map by name cost ~90 bytes a file and most of the time of
// recording a checkpoint of 100,000 files. Records of earlier builds, a
// JSON object by name, are still read.
const idsMagic = "ckpt-ids\x01"

// encodeIDs is the .ids record of ids.
func encodeIDs(ids []Identity) []byte {
	b := make([]byte, 0, len(idsMagic)+binary.MaxVarintLen64+len(ids)*24)
	b = append(b, idsMagic...)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id.Dev)
		b = binary.AppendUvarint(b, id.Ino)
		b = binary.AppendVarint(b, id.Size)
		b = binary.AppendVarint(b, id.ModTime)
	}
	return b
}

// decodeIDs reads the .ids record of the local checkpoint m describes:
// nil (nothing counts as unchanged) when it is unreadable or does not
// match m's files.
func decodeIDs(b []byte, m *manifests.Manifest) []Identity {
	if len(b) > 0 && b[0] == '{' {
		var byName map[string]Identity
		if json.Unmarshal(b, &byName) != nil {
			return nil
		}
		ids := make([]Identity, len(m.Files))
		for i, f := range m.Files {
			ids[i] = byName[f.Name]
		}
		return ids
	}
	rest, ok := bytes.CutPrefix(b, []byte(idsMagic))
	if !ok {
		return nil
	}
	r := idsReader{b: rest}
	if r.uvarint() != uint64(len(m.Files)) || r.bad {
		return nil
	}
	ids := make([]Identity, len(m.Files))
	for i := range ids {
		ids[i] = Identity{Dev: r.uvarint(), Ino: r.uvarint(), Size: r.varint(), ModTime: r.varint()}
	}
	if r.bad || len(r.b) != 0 {
		return nil
	}
	return ids
}

type idsReader struct {
	b   []byte
	bad bool
}

func (r *idsReader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.bad, r.b = true, nil
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *idsReader) varint() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.bad, r.b = true, nil
		return 0
	}
	r.b = r.b[k:]
	return v
}
