"""The zip records of a torch archive, declared once for the writer (`torchformat`) and the reader (`torchread`).

Fields in file order, little-endian, as the zip specification (APPNOTE 6.3) lays them out.
"""

from __future__ import annotations

import struct

# signature, version needed, flags, method, time, date, CRC32, compressed size, size, name length, extra length
LOCAL = struct.Struct("<4sHHHHHIIIHH")
# signature, version made by, version needed, flags, method, time, date, CRC32, compressed size, size, name length,
# extra length, comment length, disk, internal attributes, external attributes, local header offset
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
# signature, disk, directory disk, entries on this disk, entries, directory size, directory offset, comment length
END = struct.Struct("<4sHHHHIIH")
# signature, record size, version made by, version needed, disk, directory disk, entries on this disk, entries,
# directory size, directory offset
ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
# signature, disk of the zip64 end record, its offset, disk count
ZIP64_LOCATOR = struct.Struct("<4sIQI")
DESCRIPTOR = struct.Struct("<4sIII")  # signature, CRC32, compressed size, size
DESCRIPTOR64 = struct.Struct("<4sIQQ")

LOCAL_SIGNATURE, CENTRAL_SIGNATURE, END_SIGNATURE = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
ZIP64_END_SIGNATURE, ZIP64_LOCATOR_SIGNATURE, DESCRIPTOR_SIGNATURE = b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08"

EXTRA_HEADER = struct.Struct("<HH")  # an extra field's id and data length
ZIP64_EXTRA_ID = 0x0001
PAD_EXTRA_ID = 0x4246  # "FB", the padding field torch's writer puts before a tensor's data
SATURATED = 0xFFFFFFFF  # a 32-bit size or offset whose value is in the zip64 extra field
