#!/bin/bash
# The disk's ceilings for the below-eof and prealloc-overwrite goals: fio with
# the same pattern on the same file system (run it in a directory below -out),
# serial vs parallel, alternated. Usage: loadtest/ceilings.sh DIR [SECONDS]
set -e
D=$1; RT=${2:-4}
mkdir -p $D; cd $D
dd if=/dev/urandom of=w.dat bs=1M count=256 status=none; sync w.dat
iops() { python3 -c "import json,sys;d=json.load(open('$1'));w=d['jobs'][0]['write'];print('%.0f %.0f %.0f'%(w['iops'],w['clat_ns']['percentile']['50.000000']/1e3,w['clat_ns']['percentile']['99.000000']/1e3))"; }
for round in 1 2; do
 for nj in 1 8; do
  fio --name=beof --filename=w.dat --rw=randwrite --bs=4k --ioengine=psync --numjobs=$nj --fdatasync=1 --size=256m --time_based --runtime=$RT --group_reporting --output-format=json --output=beof-$nj.json >/dev/null
  echo "below-eof-ceiling round $round numjobs=$nj fdatasync=1 (iops p50us p99us): $(iops beof-$nj.json)"
 done
 for nj in 1 10; do
  rm -f p.dat; fallocate -l 1G p.dat; sync p.dat
  fio --name=pre --filename=p.dat --rw=randwrite --bs=4k --ioengine=psync --direct=1 --numjobs=$nj --size=1g --time_based --runtime=$RT --group_reporting --output-format=json --output=pre-$nj.json >/dev/null
  echo "prealloc-ceiling round $round numjobs=$nj direct fresh-fallocated (iops p50us p99us): $(iops pre-$nj.json)"
 done
done
rm -f w.dat p.dat
