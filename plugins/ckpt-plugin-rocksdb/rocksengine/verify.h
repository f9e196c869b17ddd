#ifndef CKPT_ROCKSENGINE_VERIFY_H
#define CKPT_ROCKSENGINE_VERIFY_H
#ifdef __cplusplus
extern "C" {
#endif
// ckpt_verify_sst opens the table file at path with RocksDB's
// SstFileReader and verifies the checksum of every block in it. It returns
// NULL when every block verifies, else a malloc'd message for the caller
// to free.
char* ckpt_verify_sst(const char* path);
#ifdef __cplusplus
}
#endif
#endif
