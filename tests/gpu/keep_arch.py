"""Writes a copy of a CUDA shared library in which the fatbin entries for every GPU architecture
but one have their code zeroed (headers kept), so the file compresses to a fraction of its size.
The CUDA runtime picks the entry matching the GPU from the headers and never reads the others.

    python3 keep_arch.py SRC DST SM        # e.g. SM=90 for Hopper (H100, H200)

Used by pack-offline.sh to fit onnxruntime-gpu's 284 MB libonnxruntime_providers_cuda.so into a
small transfer to a GPU machine without network access.
"""
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50


def fatbin_section(path):
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    sys.exit(f"{path} has no .nv_fatbin section")


def main():
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = bytearray(open(src, "rb").read())
    offset, size = fatbin_section(src)
    pos, end = offset, offset + size
    kept = zeroed = 0
    archs = set()
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # alignment padding between fatbins
            continue
        entry, blob_end = pos + header_size, pos + header_size + fat_size
        while entry < blob_end:
            # Entry header: kind (u16), version (u16), header size (u32), payload size (u64), ...,
            # SM architecture (u32) at byte 28.
            _kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            archs.add(arch)
            start = entry + entry_header
            if arch == keep:
                kept += payload
            else:
                data[start:start + payload] = bytes(payload)
                zeroed += payload
            entry = start + payload
        pos = blob_end
    if kept == 0:
        sys.exit(f"{src}: no code for sm_{keep}; it has sm_{sorted(archs)}")
    open(dst, "wb").write(data)
    print(f"{dst}: kept {kept} bytes of sm_{keep} code, zeroed {zeroed} (architectures: {sorted(archs)})")


if __name__ == "__main__":
    main()
