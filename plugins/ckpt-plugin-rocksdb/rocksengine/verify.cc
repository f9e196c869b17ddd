//go:build rocksdb

#include "verify.h"

#include <stdlib.h>
#include <string.h>

#include <string>

#include <rocksdb/options.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/status.h>

// The C API of RocksDB 7.8 has neither DB::VerifyChecksum nor
// SstFileReader, so this one call goes to the C++ API.
extern "C" char* ckpt_verify_sst(const char* path) {
  rocksdb::Options options;
  rocksdb::SstFileReader reader(options);
  rocksdb::Status s = reader.Open(path);
  if (s.ok()) {
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    ro.fill_cache = false;
    s = reader.VerifyChecksum(ro);
  }
  if (s.ok()) {
    return nullptr;
  }
  return strdup(s.ToString().c_str());
}
